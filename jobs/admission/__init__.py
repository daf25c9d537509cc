"""The API's decision on a submit: admit, persist and settle, or refuse with a typed reason."""
