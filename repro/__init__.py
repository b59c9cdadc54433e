"""repro: readable reproductions of Megatron-LM, ZeRO, ZeRO-Infinity, MT-NLG, T3 and GNA."""

__version__ = "0.1.0"
