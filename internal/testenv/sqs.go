package testenv

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// SQSEndpoint is FERRY_SQS_ENDPOINT, default http://127.0.0.1:9324
// (ElasticMQ started by compose/local/services.sh).
func SQSEndpoint() string { return Env("FERRY_SQS_ENDPOINT", "http://127.0.0.1:9324") }

// AWSRegion is FERRY_AWS_REGION, default us-east-1.
func AWSRegion() string { return Env("FERRY_AWS_REGION", "us-east-1") }

// SQSMotoEndpoint is FERRY_SQS_MOTO_ENDPOINT, default http://127.0.0.1:9325
// (moto's standalone server started by compose/local/services.sh, the
// second SQS implementation the SQS adapter's FIFO tests run against).
func SQSMotoEndpoint() string { return Env("FERRY_SQS_MOTO_ENDPOINT", "http://127.0.0.1:9325") }

// RefusingSQS starts, for the test's duration, a loopback HTTP server that
// answers every SQS request as AWS answers unknown credentials (HTTP 400,
// UnrecognizedClientException, x-amzn-query-error InvalidClientTokenId)
// and returns its endpoint URL. ElasticMQ accepts any credentials, so this
// stand-in is how tests see a server that refuses them.
func RefusingSQS(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.Header().Set("x-amzn-query-error", "InvalidClientTokenId;Sender")
		w.Header().Set("x-amzn-RequestId", "00000000-0000-0000-0000-000000000000")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"__type":"com.amazon.coral.service#UnrecognizedClientException","message":"The security token included in the request is invalid."}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}
