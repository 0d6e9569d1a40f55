"""The core: binding plugins to a process (plugin manager, chip selection, the accelerator), the
sourced chip catalog, the cluster spec and its one topology, and the collective efficiency tables.
Imports the contract (and, at bind time, emulation for an emulated chip); nothing above."""
