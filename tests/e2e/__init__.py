"""End-to-end tests: real daphne, Celery worker and front processes against PostgreSQL and Redis."""
