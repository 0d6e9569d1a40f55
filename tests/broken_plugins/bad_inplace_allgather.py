"""Broken plugin: all_gather_into_tensor clears its output before gathering.

The vendor zeroes the receive buffer first (to give a deterministic result where a rank's chunk
were missing). Out of place nothing shows: every chunk is then written. In place, the way FSDP2
issues it (the input is this rank's chunk of the output, and NCCL documents that as in-place
operation), the input is zeroed before it is sent, so every rank gathers zeros for this rank's
chunk. `collectives.semantics.all_gather_into_tensor` runs the in-place form.
"""
from ._base import GroupProxy, install

BUG = "all_gather_into_tensor zeroes its output first, so an in-place call (input aliasing the output) sends zeros"
CAUGHT_BY = "collectives.semantics.all_gather_into_tensor"
MESSAGE = ["in place", "the input being this rank's chunk of the output", "expected"]
LEVELS = ["collectives"]
SELECT = ["collectives.semantics.all_gather_into_tensor", "collectives.all_gather_into_tensor.float32",
          "collectives.semantics.reduce_scatter_tensor"]
STILL_PASSES = ["collectives.all_gather_into_tensor.float32", "collectives.semantics.reduce_scatter_tensor"]


class Group(GroupProxy):
    def _allgather_base(self, output, inp, *args):
        output.zero_()  # the bug: clobbers an input that aliases the output
        return self.inner._allgather_base(output, inp, *args)


install(globals(), "bad_inplace_allgather", BUG, wrap_group=Group)
