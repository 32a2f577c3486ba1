"""The composition root: `cnidra driver` wires the layers below together, and only here."""
