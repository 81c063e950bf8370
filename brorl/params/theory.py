"""The `simulate` section: the token-level simulator of BroRL §4.1 (Fig. 3).

Each field's docstring gives its unit and where its value comes from: BroRL §4.1, or our choice
where the paper is silent (docs/theory.md, section 4);
`brorl.theory.simulator.SimConfig.from_params` turns the section into the simulator's settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from brorl.params.section import Section


class SimulateParams(Section):
    """The token-level simulator of BroRL §4.1; our choices where the paper is silent are listed
    in docs/theory.md."""

    vocab_size: PositiveInt = 128_000
    """d, the vocabulary size (tokens). BroRL §4.1: 128,000."""
    num_correct: PositiveInt = 10_000
    """|P|, tokens with reward R_c. BroRL §4.1: 10,000."""
    correct_tokens: Literal["first", "random"] = "first"
    """Which tokens form P (unstated in the paper; our choice): `first` = ids 1..|P| right after the
    anchor (what an earlier independent re-run used), `random` = a random subset per seed (the
    anchor excluded). Both give the same simulation: tokens of a class are exchangeable and the
    simulator never names them (`brorl.theory.simulator._Columns`), so the choice is recorded, not
    used."""
    correct_logit: float = 3.0
    """Initial logit of correct tokens ("seeding"; 0 turns seeding off). BroRL §4.1: 3."""
    anchor_logit: float | None = 5.0
    """Logit of anchor token 0 (None: no anchor, z_0 starts at its class logit). BroRL §4.1: 5."""
    anchor_is_correct: bool = False
    """Whether the anchor belongs to P (unstated in the paper; our choice). False keeps
    Q_pos(0) = 0.6296."""
    freeze_anchor: bool = True
    """Hold z_0 at `anchor_logit` after every step ("fixing one anchor token", BroRL §4.1, read
    as frozen: our reading)."""
    temperature: float = Field(1.0, gt=0)
    """tau in p = softmax(z / tau). BroRL §4.1: 1."""
    reward_correct: float = 1.0
    """R_c, reward of a correct token. BroRL §4.1: +1."""
    reward_wrong: float = -1.0
    """R_w, reward of an incorrect token. BroRL §4.1: -1."""
    lr: float = Field(1e-3, gt=0)
    """AdamW learning rate eta. BroRL §4.1: 1e-3."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1: unstated in the paper; PyTorch default, our choice."""
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    """AdamW beta2: unstated in the paper; PyTorch default, our choice."""
    adam_eps: float = Field(1e-8, gt=0)
    """AdamW epsilon: unstated in the paper; PyTorch default, our choice."""
    weight_decay: float = Field(0.01, ge=0)
    """AdamW decoupled weight decay: unstated in the paper; PyTorch default, our choice."""
    steps: PositiveInt = 1000
    """T, optimizer steps per run. BroRL §4.1: 1000."""
    rollouts_per_prompt: list[PositiveInt] = [4, 8, 16, 512, 51_200]
    """N values swept, one curve each. BroRL §4.1: {4, 8, 16, 512, 51200}."""
    num_seeds: PositiveInt = 8
    """Independent runs per N, reported as mean and spread (the paper gives none)."""
    seed: int = 0
    """Base seed; run (N, k) uses seed + k, so each N sees the same seeds."""
    log_every: PositiveInt = 10
    """Record metrics every this many steps (and at steps 0 and T)."""
    report_steps: list[PositiveInt] = [100, 500, 1000]
    """Steps shown in the results table (our choice; docs/theory.md shows these)."""

    @model_validator(mode="after")
    def _check_sizes(self) -> SimulateParams:
        anchor = 1 if self.anchor_logit is not None else 0
        if self.num_correct + anchor >= self.vocab_size:
            raise ValueError(
                f"num_correct ({self.num_correct}) plus the anchor must be below vocab_size "
                f"({self.vocab_size}): the simulator needs at least one incorrect token. "
                "Lower num_correct or raise vocab_size."
            )
        late = [s for s in self.report_steps if s > self.steps]
        if late:
            raise ValueError(
                f"report_steps {late} exceed steps ({self.steps}); list only steps the run reaches."
            )
        return self
