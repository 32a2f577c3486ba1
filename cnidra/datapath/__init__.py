"""What cnidra sets up in a pod's network namespace beyond what the CNI plugins do: the rate
limit a claim's reserved bandwidth becomes (`shaping.py`)."""
