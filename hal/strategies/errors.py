"""Typed errors of the strategies' configuration objects (Plan, ModelConfig; the trainer's TrainConfig
too), and the one conversion of a pydantic ValidationError into them: field path (e.g.
`stages[1].replicas[0].microbatch`) and the offending value in the message. `FieldErrorModel` is the
pydantic base that raises them, `read_toml` the one reader of a config file."""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, ClassVar, Union

from pydantic import BaseModel, ValidationError

from hal.contract.errors import HalError, field_path, value_at  # noqa: F401  (field_path re-exported)


class FieldError(HalError, ValueError):
    """A configuration field that is wrong: `field` is its path, `value` what it held."""

    kind = "field"

    def __init__(self, field: str, value: Any, problem: str):
        self.field, self.value, self.problem = field, value, problem
        super().__init__(f"{self.kind} {field} = {value!r}: {problem}")


class PlanError(FieldError):
    """A Plan that is malformed or cannot run on the given cluster and model."""

    kind = "plan field"


class ModelConfigError(FieldError):
    """A model config that is malformed (sizes that do not divide, values out of range)."""

    kind = "model config field"


def from_validation_error(exc: ValidationError, data: Any, cls: type[FieldError]) -> FieldError:
    """One `cls` error for a pydantic error: every problem listed, the first one's field and value kept."""
    problems = []
    for e in exc.errors():
        # drop validator-name entries pydantic puts into loc for wrapped validators
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        value = e.get("input", value_at(data, loc))
        msg = e["msg"]
        inner = (e.get("ctx") or {}).get("error")
        if isinstance(inner, FieldError):
            # a nested model (or a model validator) raised one of ours: extend its path from here
            path = field_path(loc)
            sub = inner.field if inner.field.startswith("[") else "." + inner.field
            problems.append((inner.field if path == "(top level)" else path + sub, inner.value, inner.problem))
            continue
        if e["type"] == "missing":
            value, msg = None, "required field is missing"
        elif e["type"] == "extra_forbidden":
            msg = "unknown field"
        problems.append((field_path(loc), value, msg.removeprefix("Value error, ")))
    err = cls(*problems[0])
    if len(problems) > 1:
        err.args = ("\n".join(f"{cls.kind} {f} = {v!r}: {m}" for f, v, m in problems),)
    return err


class FieldErrorModel(BaseModel):
    """A pydantic model whose construction raises one `field_error` (listing every problem) instead of
    pydantic's ValidationError; a subclass names its FieldError subclass."""

    field_error: ClassVar[type[FieldError]] = FieldError

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise from_validation_error(exc, data, type(self).field_error) from None


def read_toml(path: Union[str, Path], cls: type[FieldError], what: str) -> dict[str, Any]:
    """The TOML file at `path` as a dict; a file that cannot be read or parsed is a `cls` error on
    field `(file)` whose value is the path: "cannot read {what}: ..."."""
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise cls("(file)", str(path), f"cannot read {what}: {exc}") from None
