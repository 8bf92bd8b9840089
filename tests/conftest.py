import os

# Keep TensorFlow quiet and small in tests; numba uses both cores for batches.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
