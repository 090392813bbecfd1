// This file serves nodeguard as Gatekeeper's external data provider.
// The K8sNodeGuardExternal template sends one key per Node DELETE review: the
// review's uid and the Node's declared fields (policies/lib/nodeguard/
// provider.rego). For each key the provider answers with what the rule reads
// for that Node: the objects that could link to it, re-read fresh from the
// API server like the webhook's decisions (objects being deleted included),
// in Gatekeeper's data.inventory layout, and the parameters nodeguard
// supplies (the kinds it syncs, the route's cluster scope). It decides
// nothing: the rule does, in Rego, inside Gatekeeper.

package admission

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/frameworks/constraint/pkg/externaldata"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nodeguard/nodeguard/enforcer/facts"
	"github.com/nodeguard/nodeguard/enforcer/rule"
)

// Routes, also the values of the metrics' route label.
const (
	ProviderRouteSelf    = "/externaldata"
	ProviderRouteCluster = "/externaldata/clusters/{namespace}/{name}"
)

// MaxProviderKeys bounds the keys of one request. The template sends one per review;
// a request naming many Nodes is not Gatekeeper's, and each key costs fresh
// reads.
const MaxProviderKeys = 16

// Reasons of nodeguard_rejected_requests_total that are the provider's own.
const (
	RejectMalformedProvider = "malformed-provider-request"
	RejectNotRequest        = "not-provider-request"
	RejectKeys              = "keys"
)

// Reasons of nodeguard_externaldata_key_errors_total: why a key got an error
// instead of facts.
const (
	ErrorBadKey          = "bad-key"
	ErrorUnknownCluster  = "unknown-cluster"
	ErrorNotReady        = "not-ready"
	ErrorCacheRecovering = "cache-recovering"
	ErrorFreshReadFailed = "fresh-read-failed"
	ErrorBusy            = "busy"
)

// ProviderFacts are what the provider reads; *guard.Guard has them.
type ProviderFacts interface {
	// Objects returns what the rule would read for node: the candidates the
	// indexes pick, re-read from the API server when fresh is set (and the
	// Guard has fresh reads). It fails while the inventory is not synced.
	Objects(ctx context.Context, node *unstructured.Unstructured, fresh bool) ([]*unstructured.Unstructured, error)
	// RouteParameters are the parameters the rule reads for a cluster
	// route: the rule takes the synced kinds and the cluster scope of them.
	RouteParameters(cluster string) (rule.Parameters, error)
	// Ready returns an error while the inventory is not synced.
	Ready() error
	// Recovering returns an error while a cache may miss objects after its
	// watch broke: an answer could then lack a linked object.
	Recovering() error
	Model() *rule.Model
}

// ProviderOptions configure the provider's routes.
type ProviderOptions struct {
	Facts ProviderFacts
	// ClientCAs is the CA of Gatekeeper's client certificate (Gatekeeper
	// presents its webhook certificate when it calls a provider); every
	// other caller gets 401. Required.
	ClientCAs *x509.CertPool
	// Clusters is asked on the cluster route: a Cluster the management
	// cluster lacks is a wrong URL, and every key gets an error.
	Clusters Clusters
	// Intake bounds the work, shared with the review routes of the port.
	Intake *Intake
	// Timeout is each request's deadline, below the Provider's timeout
	// (default: the Intake's).
	Timeout time.Duration
	Metrics *ProviderMetrics
	Log     *slog.Logger
	// DecisionLog, when set, gets every key's answer.
	DecisionLog *rule.DecisionLog
	// Mux, when set, is where the routes are added (and what is returned).
	Mux *http.ServeMux
}

// ExternalDataPath is the decision log path of the external data answers
// (facts Gatekeeper's rule decides on, not a verdict of nodeguard's rule).
const ExternalDataPath = "nodeguard/external_data"

type providerHandler struct {
	opts ProviderOptions
}

// NewProvider returns the provider's routes: /externaldata and
// /externaldata/clusters/NAMESPACE/NAME.
func NewProvider(opts ProviderOptions) (http.Handler, error) {
	if opts.ClientCAs == nil {
		return nil, fmt.Errorf("the external data provider needs the CA of Gatekeeper's client certificate")
	}
	if opts.Facts == nil || opts.Intake == nil {
		return nil, fmt.Errorf("the external data provider needs its facts and an intake")
	}
	opts.Log = cmp.Or(opts.Log, slog.New(slog.DiscardHandler))
	h := &providerHandler{opts: opts}
	mux := opts.Mux
	if mux == nil {
		mux = http.NewServeMux()
	}
	mux.HandleFunc(ProviderRouteSelf, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, ProviderRouteSelf, "") })
	mux.HandleFunc(ProviderRouteCluster, func(w http.ResponseWriter, r *http.Request) {
		h.serve(w, r, ProviderRouteCluster, r.PathValue("namespace")+"/"+r.PathValue("name"))
	})
	return mux, nil
}

func (h *providerHandler) serve(w http.ResponseWriter, r *http.Request, route, cluster string) {
	start := time.Now()
	keys, release, herr := h.read(w, r)
	if herr != nil {
		h.opts.Intake.Reject(w, herr, "external data request", route, cluster)
		h.opts.Metrics.request(route, "rejected", time.Since(start))
		return
	}
	defer release()
	ctx := r.Context()
	if h.opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.opts.Timeout)
		defer cancel()
	}
	items := h.answer(ctx, route, cluster, keys)
	body, err := json.Marshal(externaldata.ProviderResponse{
		APIVersion: "externaldata.gatekeeper.sh/v1beta1",
		Kind:       "ProviderResponse",
		// Facts change: an answer holds for the review it was asked for.
		Response: externaldata.Response{Items: items},
	})
	if err != nil {
		http.Error(w, "nodeguard: encode response: "+err.Error(), http.StatusInternalServerError)
		h.opts.Metrics.request(route, "error", time.Since(start))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
	h.opts.Metrics.request(route, "answered", time.Since(start))
}

// read checks the transport and decodes the ProviderRequest's keys; the
// caller runs the returned func once it has answered.
func (h *providerHandler) read(w http.ResponseWriter, r *http.Request) ([]string, func(), *IntakeError) {
	body, release, herr := h.opts.Intake.Read(w, r, h.opts.ClientCAs)
	if herr != nil {
		return nil, nil, herr
	}
	var req externaldata.ProviderRequest
	err := json.Unmarshal(body, &req)
	switch {
	case err != nil:
		herr = BadRequest(RejectMalformedProvider, "malformed ProviderRequest JSON: %v", err)
	case req.Kind != "ProviderRequest" || !strings.HasPrefix(req.APIVersion, "externaldata.gatekeeper.sh/"):
		herr = BadRequest(RejectNotRequest, "want kind ProviderRequest of externaldata.gatekeeper.sh; got %q, %q", req.APIVersion, req.Kind)
	case len(req.Request.Keys) == 0 || len(req.Request.Keys) > MaxProviderKeys:
		herr = BadRequest(RejectKeys, "want 1 to %d keys, got %d", MaxProviderKeys, len(req.Request.Keys))
	}
	if herr != nil {
		release()
		return nil, nil, herr
	}
	return req.Request.Keys, release, nil
}

// answer is one item per key, in order: facts, or an error saying why not.
func (h *providerHandler) answer(ctx context.Context, route, cluster string, keys []string) []externaldata.Item {
	items := make([]externaldata.Item, len(keys))
	clusterErr := h.checkCluster(ctx, cluster)
	for i, key := range keys {
		start := time.Now()
		items[i].Key = key
		node, uid, kerr := h.parse(key)
		if kerr == nil {
			kerr = clusterErr
		}
		var objects []string
		if kerr == nil {
			var value map[string]any
			value, objects, kerr = h.facts(ctx, cluster, node)
			items[i].Value = value
		}
		h.opts.Metrics.key(route, kerr)
		if kerr != nil {
			items[i].Error = kerr.msg
		}
		h.logAnswer(route, cluster, items[i], start)
		if kerr != nil {
			h.opts.Log.Info("external data", "node", node.GetName(), "uid", uid, "cluster", cluster,
				"error", kerr.msg, "reason", kerr.reason, "duration", time.Since(start))
			continue
		}
		h.opts.Log.Info("external data", "node", node.GetName(), "uid", uid, "cluster", cluster,
			"objects", objects, "duration", time.Since(start))
	}
	return items
}

// logAnswer hands one key's answer to the decision log.
func (h *providerHandler) logAnswer(route, cluster string, item externaldata.Item, start time.Time) {
	if !h.opts.DecisionLog.Enabled() {
		return
	}
	h.opts.DecisionLog.Log(rule.DecisionEvent{Path: ExternalDataPath, Time: start,
		Input: map[string]any{"key": item.Key, "cluster": cluster}, Result: map[string]any{"value": item.Value, "error": item.Error},
		Custom: map[string]any{"route": route}})
}

// keyError is why one key got no facts.
type keyError struct {
	reason string // an Error* constant
	msg    string
}

func (h *providerHandler) checkCluster(ctx context.Context, cluster string) *keyError {
	if cluster == "" || h.opts.Clusters == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, h.opts.Intake.Timeout())
	defer cancel()
	ok, _, err := h.opts.Clusters.Cluster(ctx, cluster)
	if err != nil {
		return &keyError{ErrorFreshReadFailed, fmt.Sprintf("nodeguard could not read Cluster %s (%v); retry shortly", cluster, err)}
	}
	if !ok {
		return &keyError{ErrorUnknownCluster, fmt.Sprintf("the Provider's URL names Cluster %s, which the management cluster does not have; "+
			"fix the Provider's url (nodeguard webhook-config --gatekeeper-provider --cluster)", cluster)}
	}
	return nil
}

// parse reads a key: {"uid": ..., "node": {declared Node fields}}. The Node
// is decoded into only the fields the rule declares, whatever the key holds.
func (h *providerHandler) parse(key string) (*unstructured.Unstructured, string, *keyError) {
	var k struct {
		UID  string          `json:"uid"`
		Node json.RawMessage `json:"node"`
	}
	none := &unstructured.Unstructured{Object: map[string]any{}}
	if err := json.Unmarshal([]byte(key), &k); err != nil {
		return none, "", badKey("it is not JSON: %v", err)
	}
	if k.UID == "" {
		return none, "", badKey("it carries no review uid, which keeps Gatekeeper's cache from answering another review")
	}
	if len(k.Node) == 0 {
		return none, k.UID, badKey("it carries no Node")
	}
	rec, err := h.opts.Facts.Model().NodeShape().FromJSON(k.Node)
	if err != nil {
		return none, k.UID, badKey("Node: %v", err)
	}
	node := rec.Unstructured()
	if node.GetName() == "" {
		return node, k.UID, badKey("its Node has no name")
	}
	return node, k.UID, nil
}

func badKey(format string, args ...any) *keyError {
	return &keyError{ErrorBadKey, "the key is not one the K8sNodeGuardExternal template sends: " + fmt.Sprintf(format, args...)}
}

// facts reads what the rule needs for node, within the request's deadline,
// and names the objects for the log line; concurrent keys of the same Node
// and route share one read.
func (h *providerHandler) facts(ctx context.Context, cluster string, node *unstructured.Unstructured) (map[string]any, []string, *keyError) {
	type result struct {
		value   map[string]any
		objects []string
		err     *keyError
	}
	key, err := providerFlightKey(cluster, node)
	if err != nil {
		return nil, nil, &keyError{ErrorBadKey, err.Error()}
	}
	busy := func() result {
		return result{err: &keyError{ErrorBusy, "nodeguard is answering as many requests as it may at once (--max-concurrent-decisions) " +
			"and none finished in time; retry shortly"}}
	}
	r := Do(ctx, h.opts.Intake, key, busy, func(ctx context.Context) result {
		if err := h.opts.Facts.Ready(); err != nil {
			return result{err: &keyError{ErrorNotReady, fmt.Sprintf("nodeguard is not ready (%v), so it cannot tell what is linked to Node %q; "+
				"retry once it reports ready", err, node.GetName())}}
		}
		if err := h.opts.Facts.Recovering(); err != nil {
			return result{err: &keyError{ErrorCacheRecovering, fmt.Sprintf("%v, so nodeguard cannot tell everything linked to Node %q; "+
				"this passes within seconds of the API server answering again", err, node.GetName())}}
		}
		params, err := h.opts.Facts.RouteParameters(cluster)
		if err != nil {
			return result{err: &keyError{ErrorUnknownCluster, err.Error()}}
		}
		objs, err := h.opts.Facts.Objects(ctx, node, true)
		if err != nil {
			return result{err: &keyError{ErrorFreshReadFailed, fmt.Sprintf("nodeguard could not re-read the objects linked to Node %q "+
				"from the API server (%v); retry shortly", node.GetName(), err)}}
		}
		names := make([]string, 0, len(objs))
		for _, o := range objs {
			names = append(names, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
		}
		slices.Sort(names)
		return result{value: map[string]any{"inventory": facts.Layout(objs), "parameters": params.Map()}, objects: names}
	})
	return r.value, r.objects, r.err
}

// providerFlightKey is what a provider answer depends on: the route's cluster and
// the Node as the rule reads it (not the review's uid), hashed.
func providerFlightKey(cluster string, node *unstructured.Unstructured) (string, error) {
	raw, err := json.Marshal(node.Object)
	if err != nil {
		return "", fmt.Errorf("key the Node: %w", err)
	}
	h := sha256.New()
	_, _ = fmt.Fprintf(h, "%d:%s", len(cluster), cluster)
	_, _ = h.Write(raw)
	return string(h.Sum(nil)), nil
}
