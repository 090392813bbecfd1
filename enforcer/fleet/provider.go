package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/nodeguard/nodeguard/enforcer/inventory"
	"github.com/nodeguard/nodeguard/enforcer/owned"
	"github.com/nodeguard/nodeguard/enforcer/webhookconfig"
)

// ProviderKeeper keeps Gatekeeper's external data Provider in one cluster
// pointing at nodeguard, the way the Reconciler keeps a workload cluster's
// configuration: written by package owned the moment Gatekeeper's Provider
// CRD is established, and again when the Provider is deleted or edited or
// the CA files change. (It polled every 30 s before: Gatekeeper installed
// after nodeguard failed closed for up to that long.)
type ProviderKeeper struct {
	Client dynamic.Interface
	// Name is the Provider the K8sNodeGuardExternal template asks.
	Name string
	// Options say where Gatekeeper reaches nodeguard (URL or Service).
	Options webhookconfig.Options
	CAFiles []string
	// CAInterval is how often the CA files are read (default 5s).
	CAInterval time.Duration
	Log        *slog.Logger
}

var crds = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// providerCRD is the name of Gatekeeper's Provider CRD.
var providerCRD = webhookconfig.ProviderGVR.Resource + "." + webhookconfig.ProviderGVR.Group

// Run keeps the Provider until ctx is done.
func (k *ProviderKeeper) Run(ctx context.Context) error {
	if k.Log == nil {
		k.Log = slog.New(slog.DiscardHandler)
	}
	if k.CAInterval <= 0 {
		k.CAInterval = defaultCAInterval
	}
	if _, err := readCerts(k.CAFiles); err != nil {
		return fmt.Errorf("gatekeeper provider: %w", err)
	}
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 30*time.Second),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "gatekeeper-provider"})
	defer queue.ShutDown()
	poke := func(any) { queue.Add(k.Name) }
	handlers := cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke}
	named := func(name string) dynamicinformer.TweakListOptionsFunc {
		return func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + name }
	}
	crdFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(k.Client, 0, "", named(providerCRD))
	if _, err := crdFactory.ForResource(crds).Informer().AddEventHandler(handlers); err != nil {
		return fmt.Errorf("gatekeeper provider: watch its CRD: %w", err)
	}
	// The Provider itself is watched once its CRD is served: before, a
	// watch would only back off.
	providers := dynamicinformer.NewFilteredDynamicSharedInformerFactory(k.Client, 0, "", named(k.Name))
	informer := providers.ForResource(webhookconfig.ProviderGVR).Informer()
	if _, err := informer.AddEventHandler(handlers); err != nil {
		return fmt.Errorf("gatekeeper provider: watch it: %w", err)
	}
	crdFactory.Start(ctx.Done())
	defer crdFactory.Shutdown()
	defer providers.Shutdown()
	var ca atomic.Pointer[string] // the bundle in place
	go wait.UntilWithContext(ctx, func(context.Context) {
		if b, err := readCerts(k.CAFiles); err == nil {
			if have := ca.Load(); have == nil || string(joinCerts(b)) != *have {
				queue.Add(k.Name)
			}
		}
	}, k.CAInterval)
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	watching := false
	for {
		key, shutdown := queue.Get()
		if shutdown {
			return nil
		}
		if !k.established(crdFactory) {
			queue.Done(key)
			continue // its CRD's events queue it again
		}
		if !watching {
			providers.Start(ctx.Done())
			watching = true
		}
		written, err := k.keep(ctx, informer.GetStore())
		queue.Done(key)
		if err != nil {
			k.Log.Error("keep Gatekeeper's Provider; retrying", "provider", k.Name, "error", err.Error())
			queue.AddRateLimited(key)
			continue
		}
		queue.Forget(key)
		if written != nil {
			s := string(written)
			ca.Store(&s)
		}
	}
}

// established says whether Gatekeeper's Provider CRD is served.
func (k *ProviderKeeper) established(f dynamicinformer.DynamicSharedInformerFactory) bool {
	obj, ok, _ := f.ForResource(crds).Informer().GetStore().GetByKey(providerCRD)
	if !ok {
		return false
	}
	u, _ := obj.(*unstructured.Unstructured)
	return u != nil && inventory.CRDEstablished(u)
}

// keep writes the Provider when the stored one differs; it returns the CA
// bundle now in place.
func (k *ProviderKeeper) keep(ctx context.Context, store cache.Store) ([]byte, error) {
	certs, err := readCerts(k.CAFiles)
	if err != nil {
		return nil, err
	}
	opts := k.Options
	opts.CABundle = joinCerts(certs)
	p, err := webhookconfig.BuildProvider(k.Name, opts)
	if err != nil {
		return nil, err
	}
	var have *unstructured.Unstructured
	if obj, ok, _ := store.GetByKey(k.Name); ok {
		have, _ = obj.(*unstructured.Unstructured)
	}
	// Gatekeeper may default fields of its own: only the ones nodeguard sets
	// are compared, and an apply (never a replace) takes them back.
	if owned.Sets(have, p, "spec") {
		return opts.CABundle, nil
	}
	if _, err := owned.Apply(ctx, k.Client, owned.Object{Resource: webhookconfig.ProviderGVR, Object: p}); err != nil {
		return nil, err
	}
	k.Log.Info("Gatekeeper's Provider points at nodeguard", "provider", k.Name)
	return opts.CABundle, nil
}
