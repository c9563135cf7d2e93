package httplimit

import (
	"fmt"
	"io"
	"math"
	"net/http"
)

// BodyCost returns a cost function (for WithCost) that charges a request
// the size of its body in bytes, for a byte budget (with
// WithQuotaUnit("content-bytes")):
//
//   - a body of known length is charged its Content-Length, whatever its
//     size (above the limiter's capacity it is denied with 413; on a
//     32-bit platform, a length above the largest int is charged that);
//   - a body of unknown length (Transfer-Encoding: chunked, ContentLength
//     -1) is charged maxBytes before it is read, and the body is cut at
//     maxBytes: a read past it fails with *http.MaxBytesError (and the
//     server closes the connection after the response), so the bytes read
//     never exceed the bytes charged. A client that sends less still pays
//     maxBytes: one that wants to pay what it sends sends Content-Length.
//
// Charging before the handler runs keeps the decision where it is for
// every other request, before any work; counting bytes as they are read
// would let a client over its budget start an upload and be stopped only
// part way. A request without a body costs 0, and is still decided (it
// gets the headers; a denied key's request is not denied for a cost of 0).
// It panics if maxBytes is not positive.
func BodyCost(maxBytes int) func(r *http.Request) int {
	if maxBytes <= 0 {
		panic(fmt.Sprintf("httplimit: BodyCost(%d): must be positive", maxBytes))
	}
	return func(r *http.Request) int {
		switch {
		case r.ContentLength >= 0:
			return int(min(r.ContentLength, math.MaxInt))
		case r.Body == nil || r.Body == http.NoBody:
			return 0
		}
		r.Body = &cutBody{http.MaxBytesReader(nil, r.Body, int64(maxBytes)), r.Body, int64(maxBytes)}
		return maxBytes
	}
}

// cutBody is a body of unknown length that BodyCost cut at max bytes: a
// read past them fails. The middleware, which has the ResponseWriter, cuts
// the body again with it (uncut), so that the server also closes the
// connection after the response instead of reading on, unpaid, to serve
// the next request.
type cutBody struct {
	io.ReadCloser // body, cut at max
	uncut         io.ReadCloser
	max           int64
}

// tellServer gives r's body, if BodyCost cut it, the ResponseWriter that
// its server answers r with.
func tellServer(w http.ResponseWriter, r *http.Request) {
	if b, ok := r.Body.(*cutBody); ok {
		r.Body = http.MaxBytesReader(w, b.uncut, b.max)
	}
}
