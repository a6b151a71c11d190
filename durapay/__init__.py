"""durapay: durable payment flows on Celery and Redis."""
