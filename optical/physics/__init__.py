"""Pure array functions for the physics of one optical pass, one concern each."""
