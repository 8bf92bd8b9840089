"""The click application ``placetool``."""
