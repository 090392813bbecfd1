package kube

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestObjectsGrantOnlyWhatIsAsked(t *testing.T) {
	owns := rbacv1.PolicyRule{APIGroups: []string{"x.io"}, Resources: []string{"things"}, ResourceNames: []string{"one"}, Verbs: []string{"get"}}
	for _, del := range []bool{false, true} {
		objs, err := IdentityObjects(IdentityOptions{Delete: del, Owns: []rbacv1.PolicyRule{owns}})
		require.NoError(t, err)
		kinds := map[string]map[string]any{}
		for _, o := range objs {
			kinds[o.Object.GetKind()] = o.Object.Object
			assert.Equal(t, ManagedBy, o.Object.GetLabels()["app.kubernetes.io/managed-by"])
		}
		require.Len(t, kinds, 6)
		rules, _ := json.Marshal(kinds["ClusterRole"]["rules"])
		nodes := `{"apiGroups":[""],"resources":["nodes"],"verbs":["get","list","watch"]}`
		if del {
			nodes = `{"apiGroups":[""],"resources":["nodes"],"verbs":["get","list","watch","delete"]}`
		}
		assert.JSONEq(t, `[`+nodes+`,{"apiGroups":["events.k8s.io"],"resources":["events"],"verbs":["create","patch"]},`+
			`{"apiGroups":["x.io"],"resources":["things"],"resourceNames":["one"],"verbs":["get"]}]`, string(rules))
		role, _ := json.Marshal(kinds["Role"]["rules"])
		assert.JSONEq(t, `[{"apiGroups":[""],"resources":["serviceaccounts/token"],"resourceNames":["nodeguard"],"verbs":["create"]}]`, string(role),
			"in its namespace it may only ask for its own tokens")
	}
}

// apiServer answers the applies and token requests Ensure makes: a token
// request with the admin's credentials always succeeds, one with a token
// only while refuseSelf is false.
type apiServer struct {
	mu         sync.Mutex
	applies    int
	tokens     []string // Authorization of each token request
	reads      []string // Authorization of each Node list
	issued     int
	refuseSelf bool
}

func (s *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodPatch:
		s.applies++
		_, _ = w.Write(body)
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/serviceaccounts/nodeguard/token"):
		auth := r.Header.Get("Authorization")
		s.tokens = append(s.tokens, auth)
		if auth != "Bearer admin" && s.refuseSelf {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Unauthorized","code":401}`))
			return
		}
		s.issued++
		exp := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
		_, _ = w.Write([]byte(`{"kind":"TokenRequest","apiVersion":"authentication.k8s.io/v1","status":{"token":"t` +
			string(rune('0'+s.issued)) + `","expirationTimestamp":"` + exp + `"}}`))
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes":
		s.reads = append(s.reads, r.Header.Get("Authorization"))
		_, _ = w.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":[]}`))
	default:
		http.Error(w, "not served", http.StatusNotFound)
	}
}

// The identity renews its own tokens; only when that is refused does it use
// the admin credentials again, after installing itself again.
func TestTokensRenewThemselvesAndFallBackToTheAdmin(t *testing.T) {
	s := &apiServer{}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	admin := &rest.Config{Host: srv.URL, BearerToken: "admin"}
	ctx := context.Background()
	sess, err := EnsureIdentity(ctx, admin, IdentityOptions{})
	require.NoError(t, err)
	assert.Equal(t, 6, s.applies, "installed with the admin's credentials")
	assert.Equal(t, []string{"Bearer admin"}, s.tokens, "its first token asked by the admin")
	assert.Empty(t, sess.Config.BearerToken, "the session's config carries no admin credentials")
	assert.Empty(t, sess.Config.CertData)

	kube, err := kubernetes.NewForConfig(sess.Config)
	require.NoError(t, err)
	_, err = kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"Bearer t1"}, s.reads, "requests carry the ServiceAccount's token")

	// Renewal: the token itself asks for the next one.
	tok, err := sess.tokens.Token()
	require.NoError(t, err)
	assert.Equal(t, "t2", tok.AccessToken)
	assert.Equal(t, "Bearer t1", s.tokens[1])
	assert.WithinDuration(t, time.Now().Add(48*time.Minute), tok.Expiry, time.Minute, "renewed at 80% of its life")

	// Refused (expired while nodeguard was down, or its RBAC deleted):
	// installed again, and a token asked by the admin.
	s.refuseSelf = true
	tok, err = sess.tokens.Token()
	require.NoError(t, err)
	assert.Equal(t, "t3", tok.AccessToken)
	assert.Equal(t, []string{"Bearer admin", "Bearer t1", "Bearer t2", "Bearer admin"}, s.tokens)
	assert.Equal(t, 12, s.applies)
}
