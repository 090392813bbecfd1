package facts

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// ConfigMap keeps the tombstones in nodeguard's namespace, so a restart
// (or another replica) knows them: what the API server still has cannot
// tell them again, since what carried them is gone. One key holds them all
// as JSON (EncodeTombstones): a providerID is no valid ConfigMap key.
const (
	ConfigMapName = "nodeguard-tombstones"
	ConfigMapKey  = "tombstones"
	// MaxBytes bounds the JSON, below the API server's 1 MiB object limit;
	// at about 200 bytes a tombstone it holds some 4,500.
	MaxBytes = 900 * 1024
)

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// DefaultTombstoneWriteInterval bounds how often the ConfigMap is written, and how
// long a tombstone waits to survive a restart.
const DefaultTombstoneWriteInterval = time.Second

// TombstoneKeeper keeps a Tombstones store in the ConfigMap: Load reads it at start, Run writes
// what changed (server-side apply, with the resourceVersion it last saw as
// a precondition) and takes what someone else wrote as the new base, the
// changes made here replayed on it. Deleting the ConfigMap clears every
// tombstone. Content it cannot decode is never written over: the store
// goes on without it, and it is read again when it changes.
type TombstoneKeeper struct {
	Store     *Tombstones
	Client    dynamic.Interface
	Namespace string
	Interval  time.Duration // default DefaultTombstoneWriteInterval
	Log       *slog.Logger

	mu         sync.Mutex
	seen       string // the resourceVersion last read or written; "" when absent
	unreadable bool   // it holds what Decode refuses: do not write
	unread     bool   // the last read failed: read again before writing
	// wrote are the resourceVersions this keeper's last writes made: their
	// watch events, arriving after a newer write, are not news.
	wrote   []string
	lastErr time.Time
}

// wroteKept bounds TombstoneKeeper.wrote.
const wroteKept = 16

// errorLogEvery bounds the log lines of a write that keeps failing.
const errorLogEvery = time.Minute

// Load reads the tombstones the ConfigMap holds into the store; an absent
// ConfigMap is none. Call it before the inventory's changes reach the store.
// When it cannot be read, nothing is written over it until it is read (the
// watch, or Flush reading again), and the error says why.
func (k *TombstoneKeeper) Load(ctx context.Context) error {
	cm, err := k.Client.Resource(configMaps).Namespace(k.Namespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
	if err != nil {
		absent := apierrors.IsNotFound(err)
		k.mu.Lock()
		k.unread = !absent
		k.mu.Unlock()
		if absent {
			return nil
		}
		k.Store.opts.Metrics.unreadable()
		return fmt.Errorf("read the tombstones (ConfigMap %s/%s): %w", k.Namespace, ConfigMapName, err)
	}
	k.take(cm)
	return nil
}

// take makes cm (nil: deleted) the store's base, unless it is what this
// keeper last wrote.
func (k *TombstoneKeeper) take(cm *unstructured.Unstructured) {
	rv := ""
	var raw string
	if cm != nil {
		rv = cm.GetResourceVersion()
		raw, _, _ = unstructured.NestedString(cm.Object, "data", ConfigMapKey)
	}
	k.mu.Lock()
	if rv != "" && (rv == k.seen || slices.Contains(k.wrote, rv)) {
		k.mu.Unlock()
		return
	}
	k.seen = rv
	ts, err := DecodeTombstones(raw)
	k.unreadable, k.unread = err != nil, false
	k.mu.Unlock()
	if err != nil {
		k.Store.opts.Metrics.unreadable()
		k.log().Error("tombstones: the ConfigMap holds what nodeguard cannot read; keeping the tombstones known here and not writing "+
			"over it until it is fixed or deleted", "configMap", k.Namespace+"/"+ConfigMapName, "error", err.Error())
		return
	}
	k.Store.reload(ts)
}

// Run watches the ConfigMap and writes the store's changes until ctx is
// done.
func (k *TombstoneKeeper) Run(ctx context.Context) {
	interval := k.Interval
	if interval <= 0 {
		interval = DefaultTombstoneWriteInterval
	}
	watch, err := kube.WatchObject(kube.ObjectOptions{Client: k.Client, Resource: configMaps, Namespace: k.Namespace, Name: ConfigMapName,
		Changed: k.take})
	if err != nil {
		k.log().Error("tombstones: cannot watch the ConfigMap; writing what is seen here only", "error", err.Error())
	} else {
		go watch.Run(ctx)
	}
	wait.UntilWithContext(ctx, k.Flush, interval)
}

// Flush writes the store when it differs from the ConfigMap; a conflict
// (someone else wrote it) reads it again, and the next Flush writes the
// merge.
func (k *TombstoneKeeper) Flush(ctx context.Context) {
	k.mu.Lock()
	unread := k.unread
	k.mu.Unlock()
	if unread {
		// No watch event comes for a ConfigMap that does not exist: read
		// again here.
		if err := k.Load(ctx); err != nil {
			k.logError("tombstones: cannot read the ConfigMap; writing nothing until it is read (trying every second, logged once a minute)", err)
			return
		}
	}
	k.mu.Lock()
	unreadable, seen := k.unreadable || k.unread, k.seen
	k.mu.Unlock()
	ts, n, differs := k.Store.pending()
	if !differs || unreadable {
		return
	}
	raw, fitted, err := fit(ts)
	if err != nil {
		k.log().Error("tombstones: cannot encode", "error", err.Error())
		return
	}
	if dropped := len(ts) - len(fitted); dropped > 0 {
		k.Store.drop(slices.SortedFunc(slices.Values(ts), byAge)[:dropped]) // the oldest
	}
	write := kube.ApplyOwned
	if seen == "" {
		// Absent when last seen: create it, so two replicas creating it at
		// once do not overwrite each other (the second reads and merges).
		write = kube.CreateOwned
	}
	out, err := write(ctx, k.Client, tombstoneConfigMap(k.Namespace, raw, seen))
	switch {
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
		k.Store.opts.Metrics.wrote("conflict")
		if err := k.Load(ctx); err != nil {
			k.log().Error("tombstones: cannot read the ConfigMap after a conflict", "error", err.Error())
		}
		return
	case err != nil:
		k.Store.opts.Metrics.wrote("error")
		k.logError("tombstones: cannot write the ConfigMap; a restart now would forget the newest (trying every second, "+
			"logged once a minute)", err)
		return
	}
	k.Store.opts.Metrics.wrote("ok")
	k.mu.Lock()
	k.seen = out.GetResourceVersion()
	k.wrote = append(k.wrote, k.seen)
	if len(k.wrote) > wroteKept {
		k.wrote = slices.Delete(k.wrote, 0, len(k.wrote)-wroteKept)
	}
	k.mu.Unlock()
	k.Store.written(fitted, n)
}

// tombstoneConfigMap is the ConfigMap holding raw, applied only over
// resourceVersion ("": none) so that a writer that missed another's write
// gets a conflict, reads, merges and tries again. Both writers (serve's
// keeper and `nodeguard ghosts --clear`) write it so.
func tombstoneConfigMap(namespace string, raw []byte, resourceVersion string) kube.Owned {
	meta := map[string]any{"namespace": namespace, "name": ConfigMapName,
		"labels": map[string]any{"app.kubernetes.io/name": "nodeguard", kube.ManagedByLabel: "nodeguard"}}
	if resourceVersion != "" {
		meta["resourceVersion"] = resourceVersion
	}
	return kube.Owned{Resource: configMaps, Object: &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": meta, "data": map[string]any{ConfigMapKey: string(raw)}}}}
}

// logError logs a failure of reading or writing at most once a minute.
func (k *TombstoneKeeper) logError(msg string, err error) {
	k.mu.Lock()
	quiet := time.Since(k.lastErr) < errorLogEvery
	if !quiet {
		k.lastErr = time.Now()
	}
	k.mu.Unlock()
	if !quiet {
		k.log().Error(msg, "error", err.Error())
	}
}

func (k *TombstoneKeeper) log() *slog.Logger {
	if k.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return k.Log
}

// fit encodes the newest tombstones that fit MaxBytes.
func fit(ts []Tombstone) ([]byte, []Tombstone, error) {
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b Tombstone) int { return byAge(b, a) })
	for {
		raw, err := EncodeTombstones(ts)
		if err != nil || len(raw) <= MaxBytes {
			return raw, ts, err
		}
		// Drop the entries over, and a tenth more, at least one: a few
		// passes at most.
		over := (len(raw) - MaxBytes) * len(ts) / len(raw)
		over = max(1, over+over/10)
		ts = ts[:max(0, len(ts)-over)]
	}
}

// ReadTombstones returns the tombstones the ConfigMap holds, the newest first, and
// whether it exists.
func ReadTombstones(ctx context.Context, client dynamic.Interface, namespace string) ([]Tombstone, bool, error) {
	ts, _, ok, err := readTombstones(ctx, client, namespace)
	slices.SortFunc(ts, func(a, b Tombstone) int { return byAge(b, a) })
	return ts, ok, err
}

// readTombstones reads the ConfigMap: its tombstones, its resourceVersion,
// and whether it exists.
func readTombstones(ctx context.Context, client dynamic.Interface, namespace string) ([]Tombstone, string, bool, error) {
	cm, err := client.Resource(configMaps).Namespace(namespace).Get(ctx, ConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, "", false, nil
	}
	if err != nil {
		return nil, "", false, fmt.Errorf("read ConfigMap %s/%s: %w", namespace, ConfigMapName, err)
	}
	raw, _, _ := unstructured.NestedString(cm.Object, "data", ConfigMapKey)
	ts, err := DecodeTombstones(raw)
	if err != nil {
		return nil, "", true, fmt.Errorf("ConfigMap %s/%s: %w", namespace, ConfigMapName, err)
	}
	return ts, cm.GetResourceVersion(), true, nil
}

// ClearTombstones removes the tombstones of providerIDs from the ConfigMap (the
// operator's `nodeguard ghosts --clear`), retrying on conflicts; nodeguard
// serve takes the edit as it comes. It returns those it found.
func ClearTombstones(ctx context.Context, client dynamic.Interface, namespace string, providerIDs []string) ([]string, error) {
	var found []string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		found = nil
		ts, rv, _, err := readTombstones(ctx, client, namespace)
		if err != nil {
			return err
		}
		kept := ts[:0:0]
		for _, t := range ts {
			if slices.Contains(providerIDs, t.ProviderID) {
				found = append(found, t.ProviderID)
				continue
			}
			kept = append(kept, t)
		}
		if len(found) == 0 {
			return nil
		}
		enc, err := EncodeTombstones(kept)
		if err != nil {
			return err
		}
		_, err = kube.ApplyOwned(ctx, client, tombstoneConfigMap(namespace, enc, rv))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("clear tombstones: %w", err)
	}
	return found, nil
}

// LoadTombstones returns a Tombstones store holding what the ConfigMap holds now, for a command
// that judges once (`nodeguard ghosts`, `nodeguard orphans`): an absent
// ConfigMap is no tombstone.
func LoadTombstones(ctx context.Context, client dynamic.Interface, namespace string) (*Tombstones, error) {
	ts, _, err := ReadTombstones(ctx, client, namespace)
	if err != nil {
		return nil, err
	}
	// Read only: it keeps all the ConfigMap holds, whatever the bound
	// serve writes it with.
	s := NewTombstones(TombstoneOptions{Max: max(1, len(ts))})
	s.reload(ts)
	return s, nil
}
