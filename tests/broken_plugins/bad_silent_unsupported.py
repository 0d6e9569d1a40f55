"""Broken plugin: for a dtype its CCL does not support (int16), all_reduce logs the error and
reports success instead of raising, leaving the output untouched: a silent wrong result. Its
capability matrix is honest (int16 is not declared); its behaviour for undeclared input is not."""
from ._base import DoneWork, GroupProxy, install

BUG = "undeclared dtype (int16) returns silently with the input unchanged instead of raising"
CAUGHT_BY = "collectives.all_reduce.int16.sum"
LEVELS = ["collectives"]
SELECT = ["collectives.all_reduce.int16.sum", "collectives.all_reduce.int32.sum"]
STILL_PASSES = ["collectives.all_reduce.int32.sum"]


class SwallowingWork:
    """Wraps the CCL's work; an error at wait() is logged and dropped (the bug)."""

    def __init__(self, work):
        self.work = work

    def wait(self, timeout=None):
        try:
            self.work.wait()
        except RuntimeError as exc:
            print(f"[vendor ccl] all_reduce failed: {exc}")
        return True


class Group(GroupProxy):
    def allreduce(self, tensors, opts=None, *args):
        try:
            return SwallowingWork(self.inner.allreduce(tensors, *(a for a in (opts, *args) if a is not None)))
        except RuntimeError as exc:
            print(f"[vendor ccl] all_reduce failed: {exc}")  # the bug: logged, not raised
            return DoneWork()


# typed_refusals=False: the bug is in how the plugin handles what it does not declare
install(globals(), "bad_silent_unsupported", BUG, wrap_group=Group, typed_refusals=False)
