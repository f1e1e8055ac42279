"""What is not a feature: the API adapter, credentials, leader election, the work queue and its
workers, background writers, the Event recorder, the one X.509 builder (:mod:`tls`), the one
clock (:mod:`clock`). Imports no feature package and no handlers."""
