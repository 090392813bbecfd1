package admission

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A connection over its client's share or over the total is closed at once;
// a closed one frees its place.
func TestConnectionsAreBoundedPerClientAndInTotal(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := newLimitListener(raw, 3, 2)
	defer l.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func(from string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: time.Second}
		c, err := d.Dial("tcp", raw.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	// closed reports whether the server closed c.
	closed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		return err == io.EOF
	}
	a1, a2, a3 := dial("127.0.0.1"), dial("127.0.0.1"), dial("127.0.0.1")
	assert.False(t, closed(a1))
	assert.False(t, closed(a2))
	assert.True(t, closed(a3), "a client's third connection is over its share")
	b1 := dial("127.0.0.2")
	assert.False(t, closed(b1))
	b2 := dial("127.0.0.2")
	assert.True(t, closed(b2), "over the total")

	// The server closes one of a's: its place is free again.
	first := <-accepted
	require.NoError(t, first.Close())
	assert.False(t, closed(dial("127.0.0.1")))
}
