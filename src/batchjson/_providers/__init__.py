"""Model providers: each turns a Call into raw text and usage; none of them validates.

Private: the public names are re-exported from :mod:`batchjson` (the HTTP providers lazily).
"""
