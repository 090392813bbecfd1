// This file gives nodeguard an identity of its own in each workload
// cluster: with the Cluster's kubeconfig (CAPI's admin credentials) it
// installs a ServiceAccount and the least RBAC nodeguard's work there needs,
// and from then on talks to that cluster only with the ServiceAccount's
// short-lived tokens, which the ServiceAccount renews itself. The admin
// credentials are used again only when that fails (the ServiceAccount or its
// bindings were deleted, or its token expired while nodeguard was down).

package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/oauth2"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
)

// Where nodeguard's identity lives in a workload cluster.
const (
	Namespace = "nodeguard-system"
	Name      = "nodeguard"
	// Username is how the workload API server names it (and a review's
	// userInfo does).
	Username = "system:serviceaccount:" + Namespace + ":" + Name
)

// ManagedBy is the value of ManagedByLabel on the objects installed.
const ManagedBy = "nodeguard"

// DefaultTokenTTL is the life asked for each token; the API server may
// shorten it. A token is renewed at 80% of the life it was given.
const DefaultTokenTTL = time.Hour

// IdentityOptions say what the identity may do.
type IdentityOptions struct {
	// Delete grants Node delete: the fleet's proofs are dry-run deletes,
	// which RBAC authorizes as deletes, and the reaper deletes orphans.
	// Without the reaper, nodeguard's webhook denies this identity every
	// delete that is not a dry run (admission.WebhookOptions.DryRunOnlyUser).
	Delete bool
	// Taint grants Node update: ghost protection taint keeps nodeguard's
	// taint on a ghost Node (read, then updated with its resourceVersion).
	Taint bool
	// Owns are the rules for the cluster-scoped objects nodeguard keeps
	// there (the fleet's webhook configuration), each limited to its names
	// where RBAC can be (create cannot: the name is not known to it yet).
	Owns []rbacv1.PolicyRule
	// TokenTTL is the life asked for each token (default DefaultTokenTTL).
	TokenTTL time.Duration
	Log      *slog.Logger
}

// IdentitySession is nodeguard's identity in one workload cluster.
type IdentitySession struct {
	// Config authenticates as the ServiceAccount (no admin credentials).
	Config *rest.Config
	admin  *rest.Config
	opts   IdentityOptions
	tokens *tokens
}

// EnsureIdentity installs the identity with admin (the kubeconfig's credentials),
// gets its first token, and returns the session that uses it.
func EnsureIdentity(ctx context.Context, admin *rest.Config, opts IdentityOptions) (*IdentitySession, error) {
	SetDefault(&opts.TokenTTL, DefaultTokenTTL)
	opts.Log = cmp.Or(opts.Log, slog.New(slog.DiscardHandler))
	s := &IdentitySession{admin: admin, opts: opts}
	if err := s.Repair(ctx); err != nil {
		return nil, err
	}
	t := &tokens{session: s, now: time.Now}
	first, err := t.renewWith(ctx, admin)
	if err != nil {
		return nil, err
	}
	t.first = first
	s.tokens = t
	cfg := rest.AnonymousClientConfig(admin)
	cfg.QPS, cfg.Burst, cfg.Timeout = admin.QPS, admin.Burst, admin.Timeout
	cfg.WrapTransport = transport.ResettableTokenSourceWrapTransport(transport.NewCachedTokenSource(t))
	s.Config = cfg
	return s, nil
}

// Repair installs (again) the ServiceAccount and its RBAC with the admin
// credentials: a caller whose requests are refused as unauthorized or
// forbidden calls it, and EnsureIdentity does.
func (s *IdentitySession) Repair(ctx context.Context) error {
	dyn, err := dynamic.NewForConfig(s.admin)
	if err != nil {
		return fmt.Errorf("identity: client with the kubeconfig's credentials: %w", err)
	}
	objs, err := IdentityObjects(s.opts)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if _, err := ApplyOwned(ctx, dyn, o); err != nil {
			return fmt.Errorf("identity: install nodeguard's ServiceAccount: %w", err)
		}
	}
	return nil
}

// IdentityObjects are what EnsureIdentity installs: the Namespace, the ServiceAccount, a
// ClusterRole and a Role with what nodeguard does there, and their
// bindings.
func IdentityObjects(opts IdentityOptions) ([]Owned, error) {
	labels := map[string]string{"app.kubernetes.io/name": "nodeguard", ManagedByLabel: ManagedBy}
	meta := func(namespace, name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels}
	}
	nodeVerbs := []string{"get", "list", "watch"}
	if opts.Delete {
		nodeVerbs = append(nodeVerbs, "delete")
	}
	if opts.Taint {
		nodeVerbs = append(nodeVerbs, "update")
	}
	core, rbac := corev1.SchemeGroupVersion, rbacv1.SchemeGroupVersion
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: Name, Namespace: Namespace}}
	typed := []struct {
		gvr schema.GroupVersionResource
		obj runtime.Object
	}{
		{core.WithResource("namespaces"), &corev1.Namespace{TypeMeta: tm(core, "Namespace"), ObjectMeta: meta("", Namespace)}},
		{core.WithResource("serviceaccounts"), &corev1.ServiceAccount{TypeMeta: tm(core, "ServiceAccount"), ObjectMeta: meta(Namespace, Name)}},
		{rbac.WithResource("clusterroles"), &rbacv1.ClusterRole{TypeMeta: tm(rbac, "ClusterRole"),
			ObjectMeta: meta("", Name), Rules: append([]rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: nodeVerbs},
				{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
			}, opts.Owns...)}},
		{rbac.WithResource("clusterrolebindings"), &rbacv1.ClusterRoleBinding{TypeMeta: tm(rbac, "ClusterRoleBinding"),
			ObjectMeta: meta("", Name), Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: Name}}},
		// Its own tokens, and nothing else of the namespace.
		{rbac.WithResource("roles"), &rbacv1.Role{TypeMeta: tm(rbac, "Role"),
			ObjectMeta: meta(Namespace, Name), Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, ResourceNames: []string{Name}, Verbs: []string{"create"}},
			}}},
		{rbac.WithResource("rolebindings"), &rbacv1.RoleBinding{TypeMeta: tm(rbac, "RoleBinding"),
			ObjectMeta: meta(Namespace, Name), Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: Name}}},
	}
	out := make([]Owned, 0, len(typed))
	for _, t := range typed {
		o, err := OwnedFrom(t.gvr, t.obj)
		if err != nil {
			return nil, fmt.Errorf("identity: %w", err)
		}
		out = append(out, o)
	}
	return out, nil
}

func tm(gv schema.GroupVersion, kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: gv.String(), Kind: kind}
}

// tokens is the session's token source: the ServiceAccount asks for its
// next token itself; only when that is refused are the admin credentials
// used, after installing the identity again.
type tokens struct {
	session *IdentitySession
	now     func() time.Time

	mu      sync.Mutex
	current string
	first   *oauth2.Token // Ensure's token, the first one handed out
}

// Token returns a fresh token (oauth2.TokenSource); its Expiry is when it
// should be renewed, so the caching source in front of it renews early.
func (t *tokens) Token() (*oauth2.Token, error) {
	t.mu.Lock()
	current, first := t.current, t.first
	t.first = nil
	t.mu.Unlock()
	if first != nil {
		return first, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	self := rest.AnonymousClientConfig(t.session.admin)
	self.BearerToken = current
	tok, err := t.renewWith(ctx, self)
	if err == nil {
		return tok, nil
	}
	t.session.opts.Log.Warn("identity: nodeguard's ServiceAccount could not renew its token; installing it again with the kubeconfig",
		"server", t.session.admin.Host, "error", err.Error())
	if rerr := t.session.Repair(ctx); rerr != nil {
		return nil, errors.Join(err, rerr)
	}
	return t.renewWith(ctx, t.session.admin)
}

// renewWith asks for a token of the ServiceAccount with cfg's credentials.
func (t *tokens) renewWith(ctx context.Context, cfg *rest.Config) (*oauth2.Token, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("identity: token client: %w", err)
	}
	ttl := int64(t.session.opts.TokenTTL / time.Second)
	asked := t.now()
	tr, err := kube.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("identity: token for %s: %w", Username, err)
	}
	life := tr.Status.ExpirationTimestamp.Sub(asked)
	t.mu.Lock()
	t.current = tr.Status.Token
	t.mu.Unlock()
	return &oauth2.Token{AccessToken: tr.Status.Token, TokenType: "Bearer", Expiry: asked.Add(life * 8 / 10)}, nil
}
