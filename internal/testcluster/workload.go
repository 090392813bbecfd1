package testcluster

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Kubeconfig is a kubeconfig for a workload cluster at server, as CAPI
// writes it into the Secret <name>-kubeconfig.
func Kubeconfig(t testing.TB, server string) []byte {
	t.Helper()
	return KubeconfigTLS(t, server, nil)
}

// KubeconfigTLS is Kubeconfig of a server whose certificate caPEM (nil:
// none) verifies.
func KubeconfigTLS(t testing.TB, server string, caPEM []byte) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["workload"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: "t"}
	cfg.Contexts["admin@workload"] = &clientcmdapi.Context{Cluster: "workload", AuthInfo: "admin"}
	cfg.CurrentContext = "admin@workload"
	b, err := clientcmd.Write(*cfg)
	require.NoError(t, err)
	return b
}

// ClosedPort is an https address nothing listens on: an unreachable API
// server.
func ClosedPort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "https://" + addr
}
