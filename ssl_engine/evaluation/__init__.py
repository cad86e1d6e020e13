"""Evaluation of learned features: feature computation, k-NN, low-shot and linear SVMs."""
