package faultproxy

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

func dial(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip sends a line and returns the reply and how long it took; the
// read gives up after timeout.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string, timeout time.Duration) (string, time.Duration, error) {
	t.Helper()
	start := time.Now()
	_, err := io.WriteString(c, line+"\n")
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(start.Add(timeout)))
	reply, err := r.ReadString('\n')
	return strings.TrimSuffix(reply, "\n"), time.Since(start), err
}

func TestProxy(t *testing.T) {
	p, err := Start(echoServer(t))
	require.NoError(t, err)
	c, r := dial(t, p)

	reply, _, err := roundTrip(t, c, r, "plain", time.Second)
	require.NoError(t, err)
	require.Equal(t, "plain", reply, "the proxy forwards both ways")

	p.SetDelay(150 * time.Millisecond)
	reply, took, err := roundTrip(t, c, r, "slow", time.Second)
	require.NoError(t, err)
	require.Equal(t, "slow", reply)
	require.GreaterOrEqual(t, took, 150*time.Millisecond, "the reply must be held for the delay")

	p.SetDelay(0)
	p.SetDrop(true)
	_, _, err = roundTrip(t, c, r, "lost", 200*time.Millisecond)
	var netErr net.Error
	require.ErrorAs(t, err, &netErr, "a dropped reply never arrives")
	require.True(t, netErr.Timeout())

	p.SetDrop(false)
	reply, _, err = roundTrip(t, c, r, "again", time.Second)
	require.NoError(t, err)
	require.Equal(t, "again", reply, "after the drop the connection carries new replies; the dropped one is gone")

	require.Equal(t, 1, p.Conns())
	p.CutAll()
	_, _, err = roundTrip(t, c, r, "cut", time.Second)
	require.Error(t, err, "a cut connection is closed")

	c2, r2 := dial(t, p)
	reply, _, err = roundTrip(t, c2, r2, "new", time.Second)
	require.NoError(t, err)
	require.Equal(t, "new", reply, "new connections are accepted after a cut")

	p.SetDelay(time.Hour)
	held := make(chan struct{}, 1)
	p.mu.Lock()
	p.queued = func(delay time.Duration) {
		if delay == time.Hour {
			select {
			case held <- struct{}{}:
			default:
			}
		}
	}
	p.mu.Unlock()
	_, err = io.WriteString(c2, "pending\n")
	require.NoError(t, err)
	select {
	case <-held: // the reply is queued, an hour from delivery
	case <-time.After(30 * time.Second): // only a hung test gets here
		t.Fatal("the echo server's reply never reached the proxy")
	}
	done := make(chan error)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second): // generous for a busy machine: the reply is an hour away
		t.Fatal("Close must not wait for a delayed reply")
	}
}
