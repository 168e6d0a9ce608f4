"""Benchmarks: `python -m lab bench <name>`. Each writes CSV + JSON sidecar under
datasets/results/ (or --out) and prints a summary: median over trials, min, max.

    vtap_throughput.py   the vTAP paper's Tables 1-2: PPS/Mbps/CPU per frame size and mirror
    generators.py        our XDP generator against trafgen, at the ceiling, per frame size
"""
