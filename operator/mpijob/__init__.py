"""mpijob-operator: reconciles kubeflow.org/v2beta1 MPIJobs, with topology-aware GPU placement and gang admission."""
