package bench

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/ferrymq/ferry/bench/suite"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/testenv"
)

// kindMoto is the SQS adapter on moto's server (FERRY_SQS_MOTO_ENDPOINT)
// instead of ElasticMQ ("sqs", FERRY_SQS_ENDPOINT): the SQS benchmarks
// (sqs_scale_test.go) run on both.
const kindMoto = "sqs-moto"

// sqsEndpoint is the SQS server of kind "sqs" (ElasticMQ) or kindMoto.
func sqsEndpoint(kind string) string {
	if kind == kindMoto {
		return testenv.SQSMotoEndpoint()
	}
	return testenv.SQSEndpoint()
}

// newSQSClient is an SDK client on the benchmark's server, the adapter's
// own (so the same HTTP and retry settings).
func newSQSClient(b *testing.B, kind string) (*sqs.Broker, *awssqs.Client) {
	b.Helper()
	testenv.RequireTCP(b, kind, testenv.HostPort(sqsEndpoint(kind)))
	br, err := sqs.New(benchCtx(b), sqs.Config{Endpoint: sqsEndpoint(kind), Region: testenv.AWSRegion(), Logger: quietLogger})
	must(b, err)
	b.Cleanup(func() { _ = br.Close() })
	return br, br.Client()
}

func sqsQueueURL(b *testing.B, c *awssqs.Client, name string) string {
	out, err := c.GetQueueUrl(benchCtx(b), &awssqs.GetQueueUrlInput{QueueName: aws.String(name)})
	must(b, err)
	return aws.ToString(out.QueueUrl)
}

// rawSQS is the SQS baseline: publishers at once, each sending batches of
// batch messages as SendMessageBatch calls of 10 entries, 8 calls in
// flight, all awaited before its next batch (the relay's shape), with the
// message attributes the adapter sends for an outbox row. It returns
// messages/s.
func rawSQS(b *testing.B, tp broker.Topology, n, publishers, batch int) float64 {
	b.Helper()
	_, c := newSQSClient(b, "sqs")
	url := sqsQueueURL(b, c, sqs.QueueName(tp.Exchange, tp.Queues[0].Name, false))
	elapsed, err := suite.SQSPublish(benchCtx(b), c, url, n, publishers, batch, suite.EventBody(1, bodyBytes))
	must(b, err)
	return float64(n) / elapsed.Seconds()
}

func deleteSQSTopology(b *testing.B, kind string, tp broker.Topology) {
	br, err := sqs.New(benchCtx(b), sqs.Config{Endpoint: sqsEndpoint(kind), Region: testenv.AWSRegion(), Logger: quietLogger})
	if err != nil {
		b.Logf("bench: delete topology: %v", err)
		return
	}
	defer br.Close()
	c := br.Client()
	for _, q := range tp.Queues {
		for _, name := range []string{sqs.QueueName(tp.Exchange, q.Name, false), sqs.QueueName(tp.Exchange, broker.DLQName(q.Name), false)} {
			u, err := c.GetQueueUrl(benchCtx(b), &awssqs.GetQueueUrlInput{QueueName: aws.String(name)})
			if err != nil {
				continue
			}
			if _, err := c.DeleteQueue(benchCtx(b), &awssqs.DeleteQueueInput{QueueUrl: u.QueueUrl}); err != nil {
				b.Logf("bench: delete queue %s: %v", name, err)
			}
		}
	}
}

func purgeSQS(b *testing.B, kind string, tp broker.Topology) {
	_, c := newSQSClient(b, kind)
	url := sqsQueueURL(b, c, sqs.QueueName(tp.Exchange, tp.Queues[0].Name, false))
	_, err := c.PurgeQueue(benchCtx(b), &awssqs.PurgeQueueInput{QueueUrl: aws.String(url)})
	must(b, err)
}
