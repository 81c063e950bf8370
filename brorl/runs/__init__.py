"""A run's files: its folder, the inputs checked before it starts, and what is written beside it.

- `folder`: the run folder's files (marker, params record, summary, policy to evaluate);
- `preflight`: every input a stage reads, checked before any expensive start-up;
- `files`: whole-or-nothing writes, paths relative to the checkout;
- `timings`: wall-clock figures kept beside each DVC output, never in it;
- `machine`: the machine's conditions written beside each output;
- `legacy`: the readers' fallbacks for files (and params keys) written by older releases.

Light: nothing here loads torch, so a bad input is refused in about a second.
"""
