package serve

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/rest"

	"github.com/nodeguard/nodeguard/enforcer/events"
	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// Client rate limits of the Events' own clients: apart from the informers'
// and fresh reads' (--kube-api-qps), so writing Events never takes a request
// a decision needs. The recorder's write bucket (events.DefaultLimits: 5/s,
// burst 25) binds first.
const (
	eventsQPS   = 10
	eventsBurst = 50
)

// workloadEventsWait bounds how long an Event waits for its workload
// cluster's connection to be made before it goes to the management cluster.
const workloadEventsWait = 10 * time.Second

// startEvents starts the one recorder of every Event nodeguard writes:
// denials (unless --denial-events=false), deleted orphans, ghosts and the
// fleet's. Nil, with no error, when there is no cluster to write them to.
func startEvents(ctx context.Context, c kube.Clients, opts Options, sessions *WorkloadSessions, m *events.Metrics, log *slog.Logger) (*events.Recorder, error) {
	if c.Config == nil {
		log.Warn("events off: no kubeconfig or in-cluster config to write them with")
		return nil, nil
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst = eventsQPS, eventsBurst
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create the events client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create the events client: %w", err)
	}
	instance, _ := os.Hostname() // the Pod's name in a Deployment
	ropts := events.Options{Events: kube.EventsV1(), Resolve: resolver(dyn, c.Mapper), Metrics: m, Log: log, Instance: instance}
	if opts.DenialEventsWorkloadClusters && sessions != nil {
		// Through the workload cluster's connection, as nodeguard's own
		// identity there.
		ropts.Workload = func(ctx context.Context, key string) (eventsv1client.EventsV1Interface, error) {
			// A denial right after a start waits for its cluster's connection.
			cl, err := sessions.Set.Await(ctx, key, workloadEventsWait)
			if err != nil {
				return nil, err
			}
			return cl.Events, nil
		}
	}
	rec, err := events.New(ropts)
	if err != nil {
		return nil, err
	}
	go rec.Run(ctx)
	l := rec.Limits()
	log.Info("events", "denials", !opts.NoDenialEvents, "denialsInWorkloadClusters", opts.DenialEventsWorkloadClusters,
		"queue", l.Queue, "perObject", l.PerObject, "series", l.Series, "writesPerSecond", l.WritesPerSecond,
		"writeBurst", l.WriteBurst, "patchInterval", l.PatchInterval.String(), "window", l.Window.String())
	return rec, nil
}

// denials is what the webhook calls on each denial: nil when denial Events
// are off.
func denials(rec *events.Recorder, opts Options) func(events.Denial) {
	if rec == nil || opts.NoDenialEvents {
		return nil
	}
	return rec.Record
}

// resolver references a Machine or Cluster of the management cluster at its
// served version, with its UID when it can be read.
func resolver(dyn dynamic.Interface, mapper meta.RESTMapper) events.Resolve {
	return func(ctx context.Context, gk schema.GroupKind, namespace, name string) corev1.ObjectReference {
		ref := corev1.ObjectReference{APIVersion: gk.Group, Kind: gk.Kind, Namespace: namespace, Name: name}
		m, err := mapper.RESTMapping(gk)
		if err != nil {
			return ref
		}
		ref.APIVersion = m.GroupVersionKind.GroupVersion().String()
		if obj, err := dyn.Resource(m.Resource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
			ref.UID = obj.GetUID()
		}
		return ref
	}
}
