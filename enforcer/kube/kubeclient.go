// This file builds the clients nodeguard needs of one API server,
// from a kubeconfig or a REST config, with rate limits sized for bursts of
// Node deletes.

package kube

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

// Clients are what the enforcer needs of one API server.
type Clients struct {
	Config  *rest.Config
	Dynamic dynamic.Interface
	Mapper  meta.RESTMapper
}

// Client-side rate limits of the clients (--kube-api-qps, --kube-api-burst).
// client-go's own defaults (5/s, burst 10) starve fresh reads: a
// MachineDeployment scaled down by 30 deletes 30 Nodes within a second or two,
// each decision re-reads 2 objects (Machine, InfraMachine), and CAPI tries each
// Node delete for only ~10 s. A burst of 200 covers 100 Node deletes arriving
// at once; 100/s sustains ~50 Node deletes a second (docs/performance.md
// measures the live path). The API server's priority and fairness stays the
// real limit; these only keep the client from refusing first.
const (
	DefaultQPS   float32 = 100
	DefaultBurst         = 200
)

// Connect builds clients from a kubeconfig file (empty: the usual kubectl
// search, then in-cluster) and context (empty: the current one), with the
// default rate limits.
func Connect(kubeconfig, kubeContext string) (Clients, error) {
	return ConnectWith(kubeconfig, kubeContext, DefaultQPS, DefaultBurst, nil)
}

// ConnectWith is Connect with the client rate limits given (0: the default)
// and a handler of the API server's warnings (nil: client-go's, which prints
// them to stderr).
func ConnectWith(kubeconfig, kubeContext string, qps float32, burst int, warnings rest.WarningHandlerWithContext) (Clients, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		return Clients{}, fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = qps, burst
	if warnings != nil {
		cfg.WarningHandlerWithContext = warnings
	}
	return FromConfig(cfg)
}

// FromConfig builds clients from a REST config; a QPS or Burst left 0 takes
// DefaultQPS or DefaultBurst instead of client-go's 5 and 10.
func FromConfig(cfg *rest.Config) (Clients, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS = DefaultQPS
	}
	if cfg.Burst == 0 {
		cfg.Burst = DefaultBurst
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("create client: %w", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("create discovery client: %w", err)
	}
	return Clients{Config: cfg, Dynamic: client, Mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))}, nil
}

// Protobuf is a typed client of cfg that asks for protobuf, which the API
// server serves for built-in kinds: a Node decodes several times faster, and
// with less garbage, than as JSON (the orphan scan watches every Node).
func Protobuf(cfg *rest.Config) (kubernetes.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create protobuf client: %w", err)
	}
	return kube, nil
}

// RESTMapping maps a kind to its resource; when the mapper can reset (a
// deferred discovery mapper) and does not know the kind, it resets once, so a
// CRD installed after start is found (the informers watch such kinds by the
// contract, and fresh reads must read them).
func RESTMapping(m meta.RESTMapper, gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	mapping, err := m.RESTMapping(gk, versions...)
	if err != nil && meta.IsNoMatchError(err) {
		if r, ok := m.(meta.ResettableRESTMapper); ok {
			r.Reset()
			mapping, err = m.RESTMapping(gk, versions...)
		}
	}
	return mapping, err
}
