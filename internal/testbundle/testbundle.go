// Package testbundle makes OPA bundles for tests of the enforcer's --bundle:
// nodeguard's own bundle signed with a throw-away key, bundles of other Rego
// signed the same way, and tampered copies.
package testbundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	opabundle "github.com/open-policy-agent/opa/v1/bundle"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/bundle"
	"github.com/nodeguard/nodeguard/policies"
)

// Key is an RSA signing key and its public half, as PEM and as a file.
type Key struct {
	Private       string
	Public        string
	PublicKeyFile string
}

// NewKey makes a 2048-bit RSA key (RS256, what `make bundle` signs with).
func NewKey(t testing.TB) Key {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	require.NoError(t, err)
	key := Key{
		Private: string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})),
		Public:  string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})),
	}
	key.PublicKeyFile = filepath.Join(t.TempDir(), "bundle.pub.pem")
	require.NoError(t, os.WriteFile(key.PublicKeyFile, []byte(key.Public), 0o600))
	return key
}

// Nodeguard builds nodeguard's bundle as `make bundle` does; an empty
// private key leaves it unsigned.
func Nodeguard(t testing.TB, revision, private string) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, bundle.Build(context.Background(), &buf, bundle.Options{Revision: revision, SigningKey: private}))
	return buf.Bytes()
}

// Sources returns the Rego files nodeguard's bundle holds, by path, for a
// test to change before signing them with Signed.
func Sources(t testing.TB) map[string]string {
	t.Helper()
	files, err := policies.All()
	require.NoError(t, err)
	out := map[string]string{}
	for _, f := range files {
		if f.Path != policies.GatekeeperEntry {
			out[f.Path] = f.Source
		}
	}
	return out
}

// AllowAll is an enforcer entry point that allows every delete: a stand-in
// for a team's customized policy.
const AllowAll = `package nodeguard

decision := {"allowed": true, "reason": "no-link", "blockers": [], "unverified": [], "messages": [], "warnings": []}
`

// Signed writes a bundle of the Rego files (path -> source, not compiled
// here) with nodeguard's roots, signed with private (RS256, no key ID).
func Signed(t testing.TB, files map[string]string, revision, private string) []byte {
	t.Helper()
	roots := []string{"lib/nodeguard", "nodeguard"}
	b := opabundle.Bundle{
		Manifest: opabundle.Manifest{Revision: revision, Roots: &roots},
		Data:     map[string]any{},
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		b.Modules = append(b.Modules, opabundle.ModuleFile{URL: "/" + p, Path: "/" + p, Raw: []byte(files[p])})
	}
	require.NoError(t, b.GenerateSignature(opabundle.NewSigningConfig(private, "RS256", ""), "", false))
	var buf bytes.Buffer
	require.NoError(t, opabundle.NewWriter(&buf).DisableFormat(true).Write(b))
	return buf.Bytes()
}

// Refusal is a bundle nodeguard must refuse to run, and what the refusal
// says.
type Refusal struct {
	Bundle []byte
	Want   string
}

// Refusals are the bundles no nodeguard may run, by what is wrong with them;
// the signed ones are signed with key.
func Refusals(t testing.TB, key Key) map[string]Refusal {
	t.Helper()
	broken := Sources(t)
	broken["nodeguard/decision.rego"] = "package nodeguard\n\ndecision := no_such_function(input)\n"
	noEntry := Sources(t)
	delete(noEntry, "nodeguard/decision.rego")
	return map[string]Refusal{
		"unsigned":          {Nodeguard(t, "r1", ""), "bundle missing .signatures.json"},
		"tampered":          {Tamper(t, Nodeguard(t, "r1", key.Private)), "digest mismatch"},
		"wrong key":         {Nodeguard(t, "r1", NewKey(t).Private), "verification error"},
		"does not compile":  {Signed(t, broken, "r1", key.Private), "undefined function no_such_function"},
		"lacks entry point": {Signed(t, noEntry, "r1", key.Private), "no rule data.nodeguard.decision"},
	}
}

// Tamper flips nodeguard's entry point to allow everything, keeping the
// signature of the original.
func Tamper(t testing.TB, tarball []byte) []byte {
	t.Helper()
	return Rewrite(t, tarball, func(name string, body []byte) []byte {
		if strings.HasSuffix(name, "nodeguard/decision.rego") {
			return []byte(AllowAll)
		}
		return body
	})
}

// Rewrite copies a gzipped tarball, passing each file body through edit.
func Rewrite(t testing.TB, tarball []byte, edit func(name string, body []byte) []byte) []byte {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(tarball))
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	var out bytes.Buffer
	gw := gzip.NewWriter(&out)
	tw := tar.NewWriter(gw)
	changed := false
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		body, err := io.ReadAll(tr)
		require.NoError(t, err)
		edited := edit(hdr.Name, body)
		changed = changed || !bytes.Equal(edited, body)
		hdr.Size = int64(len(edited))
		require.NoError(t, tw.WriteHeader(hdr))
		_, err = tw.Write(edited)
		require.NoError(t, err)
	}
	require.True(t, changed, "the edit must change something")
	require.NoError(t, tw.Close())
	require.NoError(t, gw.Close())
	return out.Bytes()
}

// WriteFile writes b to dir/name and returns the path.
func WriteFile(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	return path
}
