"""Distributed worlds: launcher variables, local ranks, forked starts, interrupts, backends."""
