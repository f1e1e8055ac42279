// The local cluster's kube-scheduler: Kubernetes' own scheduler command, of the cluster's version,
// with scheduler-plugins' Coscheduling (PodGroup gangs) linked in and nothing else of theirs.
// hack/build-bins.sh builds it inside the wrapper module that pins k8s.io/kubernetes.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // the REST client's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	// CoschedulingArgs in the scheduler's configuration decode through this scheme.
	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme"
	"sigs.k8s.io/scheduler-plugins/pkg/coscheduling"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand(app.WithPlugin(coscheduling.Name, coscheduling.New))))
}
