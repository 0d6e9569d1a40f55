"""The contract: what a chip plugin implements and what the rest of hal relies on.

Hookspecs and their markers, the chip base class a vendor subclasses (`chip`), the contract version,
chip identity and profiles, capability matrices, the device-runtime interface, op-kernel records and
the typed errors. This layer imports nothing of
ours outside itself; plugins reach it through `hal.sdk`.
"""
