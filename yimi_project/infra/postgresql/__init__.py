"""Django's PostgreSQL backend with the pool's health check of our choosing (``base.py``)."""
