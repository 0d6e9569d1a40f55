"""Emulation: real chips' identities on CPU tensors. The HAL_EMULATE map and CPU fabrics (gloo with
strided staging, the optional C++ shared-memory fabric `shm`), the emulated device runtime and the
timed clock (`timed`, `timed_cost`) that charges each op the time the chip's figures give."""
