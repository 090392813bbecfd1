package fleet

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// nodeServer is a simulated workload API server: it serves one cluster's
// Nodes as kube-apiserver does to an informer (list, streaming list, watch,
// get; protobuf), counts the requests, and can push watch events. It is a
// stand-in, not an API server: there is no storage, resourceVersions are
// fixed, and a watch resumed after its timeout gets only new events.
type nodeServer struct {
	srv   *httptest.Server
	names []string
	// encoded holds each Node as the API server embeds it in a watch event;
	// only this is kept, so the harness's own heap stays small (its garbage
	// collection counts in the CPU measured).
	encoded [][]byte

	requests map[string]*atomic.Int64 // list, watch, get, identity, other

	mu       sync.Mutex
	watchers map[chan []byte]bool
}

var (
	codecs   = serializer.NewCodecFactory(scheme.Scheme)
	protobuf = func() runtime.SerializerInfo {
		info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
		if !ok {
			panic("no protobuf serializer")
		}
		return info
	}()
	nodeEncoder = codecs.EncoderForVersion(protobuf.Serializer, corev1.SchemeGroupVersion)
)

func newNodeServer(nodes func(yield func(*corev1.Node) bool)) *nodeServer {
	s := &nodeServer{requests: map[string]*atomic.Int64{}, watchers: map[chan []byte]bool{}}
	for _, k := range []string{"list", "watch", "get", "identity", "health", "other"} {
		s.requests[k] = &atomic.Int64{}
	}
	for n := range nodes {
		s.names = append(s.names, n.Name)
		s.encoded = append(s.encoded, mustEncode(n))
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

func mustEncode(obj runtime.Object) []byte {
	b, err := runtime.Encode(nodeEncoder, obj)
	if err != nil {
		panic(err)
	}
	return b
}

func (s *nodeServer) count(kind string) int64 { return s.requests[kind].Load() }

func (s *nodeServer) serve(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes" && (q.Get("watch") == "true" || q.Get("watch") == "1"):
		s.requests["watch"].Add(1)
		s.watch(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes":
		s.requests["list"].Add(1)
		list := &corev1.NodeList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}
		for _, raw := range s.encoded {
			var n corev1.Node
			if err := runtime.DecodeInto(codecs.UniversalDecoder(corev1.SchemeGroupVersion), raw, &n); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			list.Items = append(list.Items, n)
		}
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
		_, _ = w.Write(mustEncode(list))
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/api/v1/nodes/"):
		s.requests["get"].Add(1)
		name := strings.TrimPrefix(r.URL.Path, "/api/v1/nodes/")
		for i, n := range s.names {
			if n == name {
				w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
				_, _ = w.Write(s.encoded[i])
				return
			}
		}
		http.Error(w, "not found", http.StatusNotFound)
	case serveIdentity(w, r, "workload"):
		s.requests["identity"].Add(1)
	case r.URL.Path == "/readyz":
		s.requests["health"].Add(1)
		_, _ = w.Write([]byte("ok"))
	default:
		s.requests["other"].Add(1)
		http.Error(w, "not served here", http.StatusNotFound)
	}
}

// watch streams the initial events when asked (the informer's streaming
// list), then pushed events and a bookmark a minute, until the client goes
// or its timeoutSeconds pass.
func (s *nodeServer) watch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	timeout := 10 * time.Minute
	if sec, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && sec > 0 {
		timeout = time.Duration(sec) * time.Second
	}
	w.Header().Set("Content-Type", runtime.ContentTypeProtobuf+";stream=watch")
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	enc := streaming.NewEncoder(protobuf.StreamSerializer.Framer.NewFrameWriter(w), protobuf.StreamSerializer.Serializer)
	send := func(typ watch.EventType, raw []byte) bool {
		if err := enc.Encode(&metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: raw}}); err != nil {
			return false
		}
		return true
	}
	bookmark := func(initialEnd bool) bool {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1"}}
		if initialEnd {
			n.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
		}
		ok := send(watch.Bookmark, mustEncode(n))
		flusher.Flush()
		return ok
	}
	if q.Get("sendInitialEvents") == "true" {
		for _, raw := range s.encoded {
			if !send(watch.Added, raw) {
				return
			}
		}
		if !bookmark(true) {
			return
		}
	}
	flusher.Flush()
	events := make(chan []byte, 1024)
	s.mu.Lock()
	s.watchers[events] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, events)
		s.mu.Unlock()
	}()
	end := time.NewTimer(timeout)
	defer end.Stop()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-end.C:
			return
		case <-tick.C:
			if q.Get("allowWatchBookmarks") == "true" && !bookmark(false) {
				return
			}
		case raw := <-events:
			if !send(watch.Modified, raw) {
				return
			}
			flusher.Flush()
		}
	}
}

// push sends a MODIFIED event of an encoded Node to every watcher.
func (s *nodeServer) push(raw []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.watchers {
		ch <- raw
	}
}

// watching is the number of open watches.
func (s *nodeServer) watching() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers)
}

// serveIdentity answers what nodeguard asks a workload API server to work
// there as its own ServiceAccount (kube.EnsureIdentity): the applies of its
// objects (echoed as sent), a TokenRequest and a SelfSubjectReview. It
// reports whether the request was one of those.
func serveIdentity(w http.ResponseWriter, r *http.Request, cluster string) bool {
	switch {
	case r.Method == http.MethodPatch && !strings.HasPrefix(r.URL.Path, "/api/v1/nodes") && !strings.Contains(r.URL.Path, "webhookconfigurations"):
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return true
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/serviceaccounts/nodeguard/token"):
		writeJSON(w, http.StatusCreated, map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
			"status": map[string]any{"token": "token-of-" + cluster, "expirationTimestamp": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}})
	case r.Method == http.MethodPost && r.URL.Path == "/apis/authentication.k8s.io/v1/selfsubjectreviews":
		writeJSON(w, http.StatusCreated, map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
			"status": map[string]any{"userInfo": map[string]any{"username": kube.Username}}})
	default:
		return false
	}
	return true
}
