"""mpijob-operator: kubeflow.org/v2beta1 MPIJobs, topology-aware GPU placement, gang admission."""
