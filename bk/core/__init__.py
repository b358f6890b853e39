"""Pure core: no I/O, no clock, no environment.  Everything is passed in."""
