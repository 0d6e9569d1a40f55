"""`TrainConfig`: what `hal train --config train.toml` runs - model, data, optimizer and lr schedule,
global batch, steps, cluster, plan, checkpoints and logs - read from TOML with pydantic; `[debug]` holds
the test-only fault injection (hal.trainer.debug). A bad field
is a `TrainConfigError` naming its path and value (hal.strategies.errors' style), e.g.
`train config field optimizer.lr = -1: Input should be greater than 0`.

Relative paths in the file (model config, data files, cluster spec, plan file, run dirs) are taken
relative to the config file's directory, so an example config runs from anywhere.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hal.strategies.errors import FieldError, FieldErrorModel, read_toml

from .tokenizer import BYTE_VOCAB  # noqa: F401 - the bytes tokenizer's vocab (one definition there)

MAX_LINK_DELAY_S = 1.0  # debug.link_delay's bound per op, far below a collective's timeout
# global_batch's upper bound: 2^20 sequences per step, over 100x the largest published pre-training
# batches (Llama 3 405B: 16M tokens = 2,048 x 8,192); a larger number is a typo, refused before launch
MAX_GLOBAL_BATCH = 1 << 20


class TrainConfigError(FieldError):
    """A train config that is malformed or names something that is not there."""

    kind = "train config field"


def _admits_bool(annotation: Any) -> bool:
    return annotation is bool or annotation is Any or any(_admits_bool(a) for a in get_args(annotation)
                                                          if get_origin(annotation) is Union)


class _Section(BaseModel):
    """Every section: frozen, unknown fields refused, numbers finite (`lr = inf` and NaN refused), and a
    boolean never taken for a number (`seed = true` is not 1)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any) -> Any:
        for name, f in cls.model_fields.items() if isinstance(data, dict) else ():
            v = data.get(name)
            values = v.items() if isinstance(v, dict) and get_origin(f.annotation) is dict else [(None, v)]
            ann = get_args(f.annotation)[1] if get_origin(f.annotation) is dict else f.annotation
            for key, x in values:
                if isinstance(x, bool) and not _admits_bool(ann):
                    raise TrainConfigError(name if key is None else f"{name}[{key}]", x,
                                           "a boolean where a number is expected")
        return data


class ModelSection(_Section):
    path: Optional[str] = Field(default=None, min_length=1, description="model config TOML (examples/models/*.toml)")
    hf: Optional[str] = Field(default=None, min_length=1, description="or a Hugging Face checkpoint directory: "
                              "its config.json and weights (hal.strategies.models.hf_io)")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="fields replacing the file's (e.g. vocab = 256 for bytes)")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSection":
        if (self.path is None) == (self.hf is None):
            raise TrainConfigError("path", self.path, f"give exactly one of model.path and model.hf (hf = {self.hf!r})")
        return self


class DataSection(_Section):
    """The corpus and its tokenizer (hal.trainer.data, hal.trainer.tokenizer; docs/training.md "Data")."""

    source: Literal["stdlib", "files", "jsonl", "tokens"] = "stdlib"
    paths: list[str] = Field(default_factory=list, description="files/jsonl/tokens: files or directories")
    glob: Optional[str] = Field(default=None, description="files under each directory (and under the stdlib); "
                                "None: *.py (stdlib, files), *.jsonl, *.bin (token shards)")
    max_bytes: int = Field(default=8 << 20, ge=1024, description="corpus cap (text bytes read, in path order)")
    val_fraction: float = Field(default=0.05, gt=0, lt=1, description="share of files (JSONL: documents) held out")
    tokenizer: Optional[str] = Field(default=None, min_length=1, description="'bytes' (None: the default, vocab "
                                     "256), a tokenizer.json path, or 'bpe:N' (trained on the corpus, cached)")
    eos: Optional[str] = Field(default=None, min_length=1, description="the end-of-text token of a tokenizer.json; "
                               "None: its tokenizer_config.json's eos_token or a well-known one")
    text_field: str = Field(default="text", min_length=1, description="source = jsonl: each line's text field")
    cache_dir: Optional[str] = Field(default=None, min_length=1, description="token cache (and bpe:N tokenizers); "
                                     "None: <log.dir>/data-cache")


class OptimizerSection(_Section):
    lr: float = Field(default=3e-3, gt=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="cosine floor as a fraction of lr")
    warmup_steps: int = Field(default=20, ge=0)
    weight_decay: float = Field(default=0.0, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)


class ClusterSection(_Section):
    spec: Optional[str] = Field(default=None, description="cluster spec TOML; None = HAL_EMULATE / HAL_CLUSTER")
    emulate: Optional[str] = Field(default=None, description="HAL_EMULATE map for a local run, e.g. cuda:2,ascend:2")
    timed: bool = Field(default=False,
                        description="timed emulation for a local run (HAL_EMULATE_TIMED=1, hal.emulation.timed)")
    time_scale: Optional[float] = Field(default=None, gt=0,
                                        description="HAL_EMULATE_TIME_SCALE; None = hal.emulation.timed's default")
    timed_dtype: Optional[str] = Field(default=None, description="HAL_EMULATE_TIMED_DTYPE: re-map the dtype timed "
                                       "emulation charges ops at ('bfloat16': every op; 'ascend:float32=bfloat16'); "
                                       "None = each op at its own dtype, a chip without a figure for it refused")
    nodes: list[str] = Field(default_factory=list, description="host names of the nodes in node-rank order, the "
                             "first 'HOST[:PORT]' the endpoint: `hal train` on each finds itself (hal.launch.nodes)")


class PlanSection(_Section):
    source: Literal["even", "auto", "file"] = "even"
    file: Optional[str] = None
    num_microbatches: int = Field(default=1, ge=1, description="even: micro-batches per step")
    pp: int = Field(default=1, ge=1, description="even: pipeline stages")
    tp: int = Field(default=1, ge=1, description="even: tensor-parallel degree")
    zero: Literal[0, 2, 3] = 0
    ep: bool = Field(default=False, description="even, MoE: expert parallel over each stage's DP group")
    max_pp: int = Field(default=4, ge=1, description="auto: deepest pipeline the planner considers")

    @model_validator(mode="after")
    def _file(self) -> "PlanSection":
        if self.source == "file" and not self.file:
            raise TrainConfigError("file", self.file, "plan.source = 'file' needs plan.file")
        return self


class CheckpointSection(_Section):
    dir: Optional[str] = Field(default=None, description="None: <log.dir>/checkpoints")
    interval: int = Field(default=0, ge=0, description="steps between checkpoints; 0 = only at the end")
    resume: bool = Field(default=True, description="resume from the latest checkpoint in dir when there is one")
    enabled: bool = True
    async_save: bool = Field(default=True,
                             description="dcp.async_save: write in a background thread (the final one waits)")
    export_hf: Optional[str] = Field(default=None, min_length=1, description="also write the final checkpoint as a "
                                     "Hugging Face checkpoint into this directory (rank 0, as `hal export --hf`)")


class LogSection(_Section):
    dir: str = Field(default="runs/train", description="run directory: metrics.jsonl, summary.json")
    val_interval: int = Field(default=50, ge=0, description="steps between validation losses; 0 = only at the end")
    val_batches: int = Field(default=2, ge=1, description="global batches in each validation")
    print_interval: int = Field(default=10, ge=1)
    tensorboard: bool = Field(default=False, description="also write TensorBoard event files to <log.dir>/tensorboard "
                              "(the tensorboard extra; hal.trainer.sinks)")
    sinks: list[str] = Field(default_factory=list, description="more metric sinks, 'module:factory' each: "
                             "factory(run_dir, chips) -> a hal.trainer.sinks.MetricSink")
    plots: bool = Field(default=True, description="draw the run's PNG plots at its end (rank 0, matplotlib, about "
                        "a second); false for scripted runs: metrics.jsonl and summary.json hold the same figures")

    @model_validator(mode="after")
    def _extra(self) -> "LogSection":
        from .sinks import TENSORBOARD_EXTRA, factory, installed
        if self.tensorboard and not installed("tensorboard"):
            raise TrainConfigError("log.tensorboard", True, f"the tensorboard package is not installed: "
                                   f"pip install 'hetero-hal[{TENSORBOARD_EXTRA}]'")
        for spec in self.sinks:  # imported now, so a typo stops `hal train` before launch
            try:
                factory(spec)
            except ValueError as exc:
                raise TrainConfigError("log.sinks", spec, str(exc)) from None
        return self


class SlowNodeSection(_Section):
    threshold: float = Field(default=0.5, gt=0,
                             description="slow = compute > (1 + threshold) x expected (hal.trainer.slow_node)")
    window: int = Field(default=5, ge=1, description="steps whose median the detector compares")
    link_threshold: float = Field(default=0.1, gt=0, description="slow link = a rank's link issue time above its "
                                  "peers' by more than this share of the step (hal.trainer.slow_node)")
    replan: bool = Field(default=False, description="on a confirmed slow node: checkpoint, write <run dir>/replan.json "
                         "with its replica weighted down and restart on it (hal train --max-restarts >= 1); "
                         "without a restart left: write it and log that a re-plan is recommended")


class EfficiencySection(_Section):
    steps: int = Field(default=8, ge=2, description="--measure-parts: steps of each sub-cluster alone and of Plan.even")
    skip: int = Field(default=2, ge=0, description="first steps left out of the tokens/s medians (start-up)")
    part: bool = Field(default=False, description="set by --measure-parts on its own runs (no efficiency lines)")
    part_even: bool = Field(default=True, description="--measure-parts: also measure each sub-cluster with "
                            "Plan.even; the best counts")


class FaultEntry(_Section):
    """One injected fault (test only): `action` on `rank` during step `step` (1-based) of the job whose
    torchrun restart count is `restart`."""

    action: Literal["kill", "freeze", "nan_grad"]
    rank: int = Field(ge=0)
    step: int = Field(ge=1, description="1-based, as printed")
    restart: int = Field(default=0, ge=0, description="the job (torchrun restart count) it fires in")
    point: str = Field(default="collective.start", min_length=1,
                       description="hetero backend: where hal.ccl_bridge.faults fires it")
    seconds: float = Field(default=3600.0, gt=0, description="freeze: how long the rank sleeps")


class DebugSection(_Section):
    """TEST ONLY: faults, a slower chip and a slower link injected into a run (hal.trainer.debug), so
    the tests can exercise fault handling and the slow-node checks end to end. Empty in every real run."""

    faults: list[FaultEntry] = Field(default_factory=list, description="ranks killed or frozen mid-step, or "
                                     "a NaN put into a gradient (nan_grad)")
    throttle: dict[int, float] = Field(default_factory=dict, description="rank -> factor >= 1: its timed-"
                                       "emulation chip charges every op that many times its profile's time")
    link_delay: dict[int, float] = Field(default_factory=dict, description="rank -> seconds in (0, 1]: it "
                                         "sleeps that long before each collective or send it submits")

    @model_validator(mode="after")
    def _bounds(self) -> "DebugSection":
        for rank, factor in self.throttle.items():
            if rank < 0 or not factor >= 1.0:
                raise TrainConfigError(f"throttle[{rank}]", factor, "rank must be >= 0 and factor >= 1")
        for rank, seconds in self.link_delay.items():
            if rank < 0 or not 0.0 < seconds <= MAX_LINK_DELAY_S:
                raise TrainConfigError(f"link_delay[{rank}]", seconds, f"rank must be >= 0 and seconds in "
                                       f"(0, {MAX_LINK_DELAY_S:g}] (a bounded delay, below any collective timeout)")
        return self

    @property
    def active(self) -> bool:
        return bool(self.faults or self.throttle or self.link_delay)


class TrainSection(_Section):
    on_nonfinite: Literal["stop", "skip"] = Field(
        default="stop", description="a non-finite loss, gradient or grad norm: stop the run (naming step, rank, "
        "parameter), or skip the optimizer step on every rank and count it (hal.trainer.nonfinite)")
    max_skipped: int = Field(default=10, ge=0, description="on_nonfinite = skip: stop once more steps than this "
                             "were skipped")
    precision: Literal["fp32", "bf16", "fp16", "auto"] = Field(
        default="fp32", description="compute dtype, float32 master weights and gradient reduction either way: "
        "auto = bf16 on chips whose profile has bfloat16, fp16 with dynamic loss scaling on one without "
        "(hal.strategies.precision); a dtype a chip lacks is refused naming rank, chip and dtype")


class TrainConfig(_Section, FieldErrorModel):
    field_error = TrainConfigError
    seed: int = 0
    steps: int = Field(ge=1, description="steps of the schedule (cosine decays to its end)")
    stop_after: Optional[int] = Field(
        default=None, ge=1, description="stop at this step (checkpoint written) without changing the schedule")
    global_batch: int = Field(ge=1, le=MAX_GLOBAL_BATCH, description="sequences per step over the whole cluster "
                              "(at most 2^20)")
    backend: Literal["hetero", "gloo"] = "hetero"
    timeout_s: float = Field(default=120.0, gt=0, description="bound of every collective")
    model: ModelSection
    data: DataSection = DataSection()
    optimizer: OptimizerSection = OptimizerSection()
    cluster: ClusterSection = ClusterSection()
    plan: PlanSection = PlanSection()
    checkpoint: CheckpointSection = CheckpointSection()
    log: LogSection = LogSection()
    slow_node: SlowNodeSection = SlowNodeSection()
    efficiency: EfficiencySection = EfficiencySection()
    debug: DebugSection = DebugSection()
    train: TrainSection = TrainSection()
    base_dir: str = Field(default=".", description="set by from_toml: the config file's directory")

    @model_validator(mode="after")
    def _cross(self) -> "TrainConfig":
        if self.stop_after is not None and self.stop_after > self.steps:
            raise TrainConfigError("stop_after", self.stop_after, f"exceeds steps = {self.steps}")
        if self.optimizer.warmup_steps >= self.steps:
            raise TrainConfigError("optimizer.warmup_steps", self.optimizer.warmup_steps,
                                   f"must be below steps = {self.steps}")
        if self.data.source != "stdlib" and not self.data.paths:
            raise TrainConfigError("data.paths", self.data.paths,
                                   f"data.source = {self.data.source!r} needs at least one path")
        return self

    # ---- files -------------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: Union[str, Path]) -> "TrainConfig":
        path = Path(path)
        data = read_toml(path, TrainConfigError, "train config")
        data.setdefault("base_dir", str(path.resolve().parent))
        return cls(**data)

    def resolve(self, p: Optional[str]) -> Optional[Path]:
        """A path of the config, relative to its file's directory."""
        if p is None:
            return None
        q = Path(p).expanduser()
        return q if q.is_absolute() else Path(self.base_dir) / q

    @property
    def run_dir(self) -> Path:
        return self.resolve(self.log.dir)

    @property
    def checkpoint_dir(self) -> Path:
        return self.resolve(self.checkpoint.dir) if self.checkpoint.dir else self.run_dir / "checkpoints"

    @property
    def last_step(self) -> int:
        return self.stop_after or self.steps

    def load_model_config(self):
        """The strategies ModelConfig: the file's fields with `model.overrides` on top."""
        from hal.strategies.errors import ModelConfigError
        from hal.strategies.models import ModelConfig
        if self.model.hf is not None:  # a HF checkpoint's config.json (an unsupported field refused by name)
            from hal.contract.errors import HalError
            from hal.strategies.models.hf_io import model_config_from_hf
            try:
                base = model_config_from_hf(self.resolve(self.model.hf))
            except HalError as exc:
                raise TrainConfigError("model.hf", self.model.hf, str(exc)) from None
        else:
            path = self.resolve(self.model.path)
            if not path.is_file():
                raise TrainConfigError("model.path", self.model.path, f"no such file ({path})")
            base = ModelConfig.from_toml(path)
        try:
            cfg = ModelConfig(**{**base.model_dump(), **self.model.overrides})
        except ModelConfigError as exc:
            raise TrainConfigError(f"model.overrides.{exc.field}", exc.value, exc.problem) from None
        from .data import check_data  # the tokenizer's vocab must fit the model's: refused before torchrun starts
        from .tokenizer import TokenizerError
        try:
            need = check_data(self)
        except (TokenizerError, ValueError) as exc:
            raise TrainConfigError(getattr(exc, "field", "data"), getattr(exc, "value", self.data.source),
                                   getattr(exc, "problem", str(exc))) from None
        if cfg.vocab < need:
            raise TrainConfigError("data.tokenizer", self.data.tokenizer or "bytes",
                                   f"the tokenizer's vocab is {need} tokens, the model's vocab = {cfg.vocab}: set "
                                   f"model.overrides.vocab >= {need}")
        return cfg

    def lr_at(self, step: int) -> float:
        """lr of step `step` (0-based): linear warmup to `lr` over warmup_steps, then cosine to
        lr x min_lr_ratio at `steps` - a pure function of the step, so resume needs only the step."""
        o = self.optimizer
        if step < o.warmup_steps:
            return o.lr * (step + 1) / o.warmup_steps
        t = (step - o.warmup_steps) / max(1, self.steps - o.warmup_steps)
        floor = o.lr * o.min_lr_ratio
        return floor + (o.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))
