package fleet

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// ProviderKeeper keeps Gatekeeper's external data Provider in one cluster
// pointing at nodeguard, the way the Reconciler keeps a workload cluster's
// configuration: written by kube.ApplyOwned the moment Gatekeeper's Provider
// CRD is established, and again when the Provider is deleted or edited or
// the CA files change. (It polled every 30 s before: Gatekeeper installed
// after nodeguard failed closed for up to that long.)
type ProviderKeeper struct {
	Client dynamic.Interface
	// Name is the Provider the K8sNodeGuardExternal template asks.
	Name string
	// Options say where Gatekeeper reaches nodeguard (URL or Service).
	Options admission.WebhookConfigOptions
	CAFiles []string
	// CAInterval is how often the CA files are read (default 5s).
	CAInterval time.Duration
	Log        *slog.Logger
}

var crds = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// providerCRD is the name of Gatekeeper's Provider CRD.
var providerCRD = admission.ProviderGVR.Resource + "." + admission.ProviderGVR.Group

// Run keeps the Provider until ctx is done.
func (k *ProviderKeeper) Run(ctx context.Context) error {
	k.Log = cmp.Or(k.Log, slog.New(slog.DiscardHandler))
	kube.SetDefault(&k.CAInterval, defaultCAInterval)
	if _, err := readCerts(k.CAFiles); err != nil {
		return fmt.Errorf("gatekeeper provider: %w", err)
	}
	var (
		ca       atomic.Pointer[string] // the bundle in place
		watching sync.Once
		provider *kube.ObjectWatch
		crd      *kube.ObjectWatch
	)
	loop := kube.NewLoop(kube.LoopOptions{Name: "gatekeeper-provider", MaxBackoff: 30 * time.Second}, func(ctx context.Context, _ string) kube.Result {
		if obj, ok := crd.Get(); !ok || !facts.CRDEstablished(obj) {
			return kube.Result{} // its CRD's events queue it again
		}
		// The Provider itself is watched once its CRD is served: before, a
		// watch would only back off.
		watching.Do(func() { go provider.Run(ctx) })
		if !provider.Synced() {
			return kube.Result{After: 100 * time.Millisecond}
		}
		have, _ := provider.Get()
		written, err := k.keep(ctx, have)
		if err != nil {
			k.Log.Error("keep Gatekeeper's Provider; retrying", "provider", k.Name, "error", err.Error())
			return kube.Result{Retry: true}
		}
		s := string(written)
		ca.Store(&s)
		return kube.Result{}
	})
	poke := func(*unstructured.Unstructured) { loop.Add(k.Name) }
	var err error
	if crd, err = kube.WatchObject(kube.ObjectOptions{Client: k.Client, Resource: crds, Name: providerCRD, Changed: poke}); err != nil {
		return fmt.Errorf("gatekeeper provider: watch its CRD: %w", err)
	}
	if provider, err = kube.WatchObject(kube.ObjectOptions{Client: k.Client, Resource: admission.ProviderGVR, Name: k.Name, Changed: poke}); err != nil {
		return fmt.Errorf("gatekeeper provider: watch it: %w", err)
	}
	go crd.Run(ctx)
	go wait.UntilWithContext(ctx, func(context.Context) {
		if b, err := readCerts(k.CAFiles); err == nil {
			if have := ca.Load(); have == nil || string(joinCerts(b)) != *have {
				loop.Add(k.Name)
			}
		}
	}, k.CAInterval)
	loop.Run(ctx)
	return nil
}

// keep writes the Provider when the stored one differs; it returns the CA
// bundle now in place.
func (k *ProviderKeeper) keep(ctx context.Context, have *unstructured.Unstructured) ([]byte, error) {
	certs, err := readCerts(k.CAFiles)
	if err != nil {
		return nil, err
	}
	opts := k.Options
	opts.CABundle = joinCerts(certs)
	p, err := admission.BuildProvider(k.Name, opts)
	if err != nil {
		return nil, err
	}
	// Gatekeeper may default fields of its own: only the ones nodeguard sets
	// are compared, and an apply (never a replace) takes them back.
	if kube.Sets(have, p, "spec") {
		return opts.CABundle, nil
	}
	if _, err := kube.ApplyOwned(ctx, k.Client, kube.Owned{Resource: admission.ProviderGVR, Object: p}); err != nil {
		return nil, err
	}
	k.Log.Info("Gatekeeper's Provider points at nodeguard", "provider", k.Name)
	return opts.CABundle, nil
}
