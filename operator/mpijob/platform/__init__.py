"""What is not a feature: the API adapter, credentials, leader election, the work queue and its
workers, background writers, the Event recorder. Imports no feature package and no handlers."""
