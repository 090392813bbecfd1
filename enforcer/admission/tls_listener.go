package admission

import (
	"net"
	"sync"
)

// Connection bounds of the port. A connection costs ~40 KiB while it
// carries a request (TLS and HTTP buffers, its goroutine's stack) before a
// body byte is read, and the byte budget (intake) bounds the bodies: 1,024
// connections stay under ~40 MiB. One client (an address) gets at most a
// quarter of them, so a flood from one source leaves room for the API server
// and Gatekeeper, which need few: they speak HTTP/2, whose streams per
// connection are bounded too (TLSServer's HTTP2 settings).
const (
	MaxConnections          = 1024
	MaxConnectionsPerClient = 256
)

// limitListener closes, as soon as it is accepted, a connection over the
// total or over its client's share, rather than queueing it: a queued one
// would hold the accept loop for everyone.
type limitListener struct {
	net.Listener
	total, perClient int

	mu       sync.Mutex
	open     int
	byClient map[string]int
}

func newLimitListener(l net.Listener, total, perClient int) *limitListener {
	return &limitListener{Listener: l, total: total, perClient: perClient, byClient: map[string]int{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := clientOf(c)
		l.mu.Lock()
		ok := l.open < l.total && l.byClient[client] < l.perClient
		if ok {
			l.open++
			l.byClient[client]++
		}
		l.mu.Unlock()
		if !ok {
			_ = c.Close()
			continue
		}
		return &limitedConn{Conn: c, release: func() { l.release(client) }}, nil
	}
}

func (l *limitListener) release(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.byClient[client]--; l.byClient[client] == 0 {
		delete(l.byClient, client)
	}
}

// clientOf is the connection's remote address without its port.
func clientOf(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
