"""KL-guided quantization: which projections to store in int8/int4/fp8, chosen by their effect on the output
distribution under a KL budget (measure.py: calibration and KL; selection.py: the greedy choice and its repair)."""
