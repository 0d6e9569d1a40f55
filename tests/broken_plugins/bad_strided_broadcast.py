"""Broken plugin: broadcast reads and writes `numel` contiguous elements from the data pointer.

Exactly torch 2.13's own gloo bug (pytorch/pytorch#192920): a strided view is broadcast as if it
were contiguous, so non-root ranks get the wrong elements and their neighbouring data is
overwritten. Here the plugin hands views straight to raw gloo instead of staging them.
"""
from ._base import GroupProxy, install

BUG = "broadcast ignores strides (raw torch 2.13 gloo)"
CAUGHT_BY = "collectives.broadcast.float32"
LEVELS = ["collectives"]
SELECT = ["collectives.broadcast.float32", "collectives.all_gather.float32"]
STILL_PASSES = ["collectives.all_gather.float32"]
MESSAGE = ["strided views"]


class Group(GroupProxy):
    def broadcast(self, tensors, opts=None, *args):
        return self.inner.gloo.broadcast(tensors, *(a for a in (opts, *args) if a is not None))


install(globals(), "bad_strided_broadcast", BUG, wrap_group=Group)
