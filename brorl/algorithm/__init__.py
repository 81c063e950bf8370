"""The ProRL/BroRL update as pure tensor functions (BroRL §3.1; the ProRLv2 blog post): advantages,
dynamic sampling, the clipped policy loss with KL and truncated importance sampling, and the
schedules.

No I/O, no globals. Shapes: B prompts, N rollouts per prompt, T response tokens, V vocabulary.
Submodules are imported explicitly (`brorl.algorithm.losses`); this file imports nothing, so that
`brorl.params` can use `schedule` without loading torch.
"""
