package main

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/redlimittest"
)

func TestAPI(t *testing.T) {
	env := redlimittest.New(t)
	// The service's own 50ms decision budget: redlimittest's client
	// outlasts it, so a loaded CI machine still sees every decision.
	api, err := newAPI(env.Client(), []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, 50*time.Millisecond)
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	defer srv.Close()

	do := func(method, path, body string, header http.Header) *http.Response {
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header = header
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	for i := range 5 {
		resp := do(http.MethodGet, "/hello", "", nil)
		require.Equal(t, 200, resp.StatusCode, "hello %d of the burst of 5", i+1)
		assert.Equal(t, `"hello";q=5;w=5`, resp.Header.Get("RateLimit-Policy"))
	}
	resp := do(http.MethodGet, "/hello", "", nil)
	assert.Equal(t, 429, resp.StatusCode, "6th hello")
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))

	assert.Equal(t, 401, do(http.MethodPost, "/upload", "x", nil).StatusCode, "upload without an API key")
	key := http.Header{"X-Api-Key": {"k"}}
	resp = do(http.MethodPost, "/upload", strings.Repeat("x", 1000), key)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, `"upload";r=1047576;t=60`, resp.Header.Get("RateLimit"))
	assert.Equal(t, 413, do(http.MethodPost, "/upload", strings.Repeat("x", 2<<20), key).StatusCode, "larger than the whole budget")
}

func TestParsePrefixes(t *testing.T) {
	got, err := parsePrefixes(" 10.0.0.0/8, ,fd00::/8")
	require.NoError(t, err)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}, got)
	_, err = parsePrefixes("10.0.0.1")
	assert.ErrorContains(t, err, "TRUSTED_PROXIES")
}
