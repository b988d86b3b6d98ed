"""Configuration schemas: every section of the run file and of the SFT file.

A leaf: it imports the loss's mode names (`algos.modes`) and `mutualrl.common`, never a runtime
module, so a config validates without torch or a model.
"""
