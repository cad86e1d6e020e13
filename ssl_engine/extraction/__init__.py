"""The extraction workflow: a frozen model's features (or its heads' label predictions) of
whole splits, written to .npy files. Above the trainer (it shares its process set-up,
``trainer/process.py``) and below the engines that call it (``engines/extract_*.py``).

- ``extractor.py``: ``FeatureExtractor(cfg, dist_run_id)``, the entry point in every rank;
- ``write_splits.py``: the extraction of every split, streamed to disk; ``rank_files.py``: the
  temporary files of the ranks and their merge into dataset order; ``errors.py``: the
  errors, each one message for the user;
- ``label_predictions.py``: top-k classes and softmax scores of the heads, as features;
- ``cluster_assignments.py``: every image's prototype of a SwAV head (``extract_cluster``);
- ``one_view.py``: one deterministic view per image (config.EXTRACT_FEATURES);
- ``files.py``: the output folder's files and index, and loading them (the evaluation tools).

The forward pass over a loader (``evaluation/feature_batches.py``) and the in-training features of
the kNN and report hooks (``evaluation/labelled_features.py``) stay in ``ssl_engine.evaluation``:
the hooks, below this package, use them.
"""
