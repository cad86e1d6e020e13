"""Evaluation of learned features: feature computation, k-NN and low-shot classifiers."""
