package httplimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/redlimittest"
)

// onlyReader hides a body's type, so that the client cannot tell its
// length and sends it chunked.
type onlyReader struct{ io.Reader }

// A byte budget holds against chunked uploads: once a client has spent its
// budget, a body of unknown length is charged the stated maximum and
// denied, and one that is allowed is cut at what it paid.
func TestBodyCostChunkedUploads(t *testing.T) {
	env := redlimittest.New(t)
	// 100 KB per hour per client.
	l, err := redlimit.NewFixedWindow(env.Client(), 100_000, time.Hour, env.Options()...)
	require.NoError(t, err)
	read := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		io.WriteString(w, strings.Repeat("x", int(n%10))) // say nothing useful; the status is what counts
	})
	h := Middleware(l, WithCost(BodyCost(50_000)), WithQuotaUnit("content-bytes"))(read)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	upload := func(body io.Reader) (status int, rateLimit string) {
		t.Helper()
		resp, err := srv.Client().Post(srv.URL, "application/octet-stream", body)
		require.NoError(t, err)
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("RateLimit")
	}
	chunked := func(size int) io.Reader { return onlyReader{bytes.NewReader(make([]byte, size))} }

	status, rl := upload(chunked(40_000))
	assert.Equal(t, 200, status, "a chunked upload within the budget")
	assert.Equal(t, `"default";r=50000;t=3600`, rl, "charged the stated maximum, 50 KB")
	status, rl = upload(bytes.NewReader(make([]byte, 30_000)))
	assert.Equal(t, 200, status, "a 30 KB upload with Content-Length")
	assert.Equal(t, `"default";r=20000;t=3600`, rl, "charged its length")
	for i := range 4 {
		status, _ = upload(chunked(40_000))
		assert.Equal(t, 429, status, "chunked upload %d after the budget is spent", i)
	}
	status, _ = upload(bytes.NewReader(make([]byte, 20_000)))
	assert.Equal(t, 200, status, "what is left is still usable with Content-Length")

	// A chunked body longer than what it paid is cut there.
	env.Advance(time.Hour)
	status, _ = upload(chunked(60_000))
	assert.Equal(t, 413, status, "a chunked body past the maximum cannot be read")
}

// A chunked body cut at what it paid ends its connection: the server does
// not read the rest, which nobody paid for, to serve the next request.
func TestBodyCostCutBodyClosesTheConnection(t *testing.T) {
	env := redlimittest.New(t)
	l, err := redlimit.NewFixedWindow(env.Client(), 1_000_000, time.Hour, env.Options()...)
	require.NoError(t, err)
	read := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		}
	})
	srv := httptest.NewServer(Middleware(l, WithCost(BodyCost(10_000)), WithQuotaUnit("content-bytes"))(read))
	t.Cleanup(srv.Close)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))

	// 100 KB past the 10 KB paid: less than what Go's server would read on
	// after a handler to keep the connection.
	body := strings.Repeat("a", 110_000)
	_, err = fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	require.NoError(t, err)
	replies := bufio.NewReader(conn)
	resp, err := http.ReadResponse(replies, nil)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)

	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if err == nil {
		resp, err = http.ReadResponse(replies, nil)
	}
	if err == nil {
		resp.Body.Close()
		t.Fatalf("the connection served another request (%d) after a body cut short", resp.StatusCode)
	}
}

func TestBodyCost(t *testing.T) {
	cost := BodyCost(1000)
	for _, tt := range []struct {
		name string
		req  *http.Request
		want int
	}{
		{"no body", httptest.NewRequest(http.MethodGet, "/", nil), 0},
		{"known length", httptest.NewRequest(http.MethodPost, "/", strings.NewReader("12345")), 5},
		{"known length above the maximum", httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat("x", 5000))), 5000},
		{"unknown length", httptest.NewRequest(http.MethodPost, "/", onlyReader{strings.NewReader("12345")}), 1000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, cost(tt.req))
		})
	}
	assert.Panics(t, func() { BodyCost(0) })
}

// A byte budget above 2 GiB holds against bodies that declare more than
// 2 GiB: each is charged its full Content-Length (the handler here reads
// none of it), so a 10 GiB budget admits one 8 GiB upload, not five.
func TestBodyCostBeyond2GiB(t *testing.T) {
	if strconv.IntSize == 32 {
		t.Skip("a byte budget above 2 GiB needs a 64-bit int")
	}
	env := redlimittest.New(t)
	gib := int64(1) << 30
	l, err := redlimit.NewFixedWindow(env.Client(), int(10*gib), 24*time.Hour, env.Options()...)
	require.NoError(t, err)
	h := Middleware(l, WithCost(BodyCost(10<<20)), WithQuotaUnit("content-bytes"), WithKeyFunc(Header("X-API-Key")))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	put := func(length int64) int {
		r := httptest.NewRequest(http.MethodPut, "/", strings.NewReader("x"))
		r.Header.Set("X-API-Key", "tenant")
		r.ContentLength = length
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	assert.Equal(t, 200, put(8*gib), "the first 8 GiB of a 10 GiB budget")
	for i := range 4 {
		assert.Equal(t, 429, put(8*gib), "8 GiB upload %d after 8 GiB of 10 were spent", i)
	}
	assert.Equal(t, 413, put(11*gib), "above the budget itself")
	assert.Equal(t, 413, put(math.MaxInt64), "the largest Content-Length")
	assert.Equal(t, 200, put(2*gib), "what is left is still usable")
}
