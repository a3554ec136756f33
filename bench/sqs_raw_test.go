package bench

import (
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ferrymq/ferry/bench/suite"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/testenv"
)

// sqsSendConcurrency is the number of SendMessageBatch calls one Publish
// of the adapter has in flight at once (brokers/sqs sendConcurrency): the
// raw baseline uses the same, so it is the relay's shape without ferry.
const sqsSendConcurrency = 8

// newSQSClient is an SDK client on the benchmark's server, the adapter's
// own (so the same HTTP and retry settings).
func newSQSClient(b *testing.B) (*sqs.Broker, *awssqs.Client) {
	b.Helper()
	testenv.RequireTCP(b, "sqs", testenv.HostPort(testenv.SQSEndpoint()))
	br, err := sqs.New(benchCtx(b), sqs.Config{Endpoint: testenv.SQSEndpoint(), Region: testenv.AWSRegion(), Logger: quietLogger})
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
	_, c := newSQSClient(b)
	ctx := benchCtx(b)
	url := sqsQueueURL(b, c, sqs.QueueName(tp.Exchange, tp.Queues[0].Name, false))
	headers, _ := json.Marshal(map[string]string{broker.HeaderTraceparent: traceparent, broker.HeaderCreatedAt: broker.FormatTime(time.Now())})
	str := func(v string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	start := time.Now()
	for p := 0; p < publishers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				first := next.Add(int64(batch)) - int64(batch)
				if first >= int64(n) {
					return
				}
				last := min(first+int64(batch), int64(n))
				var cwg sync.WaitGroup
				sem := make(chan struct{}, sqsSendConcurrency)
				var failed atomic.Int64
				for i := first; i < last; i += 10 {
					var entries []types.SendMessageBatchRequestEntry
					for j := i; j < min(i+10, last); j++ {
						id := strconv.FormatInt(j+1, 10)
						entries = append(entries, types.SendMessageBatchRequestEntry{
							Id: aws.String("m" + id), MessageBody: aws.String(string(suite.EventBody(j+1, bodyBytes))),
							MessageAttributes: map[string]types.MessageAttributeValue{
								"ferry-id": str(id), "ferry-type": str(eventType), "ferry-key": str("user-" + strconv.FormatInt(j%100, 10)),
								"ferry-headers": str(string(headers)),
							}})
					}
					cwg.Add(1)
					sem <- struct{}{}
					go func() {
						defer cwg.Done()
						defer func() { <-sem }()
						out, err := c.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
						if err != nil || len(out.Failed) > 0 {
							failed.Add(1)
							if err != nil {
								select {
								case errs <- err:
								default:
								}
							}
						}
					}()
				}
				cwg.Wait()
				if failed.Load() > 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(b, err)
	}
	return float64(n) / time.Since(start).Seconds()
}

func deleteSQSTopology(b *testing.B, tp broker.Topology) {
	br, err := sqs.New(benchCtx(b), sqs.Config{Endpoint: testenv.SQSEndpoint(), Region: testenv.AWSRegion(), Logger: quietLogger})
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

func purgeSQS(b *testing.B, tp broker.Topology) {
	_, c := newSQSClient(b)
	url := sqsQueueURL(b, c, sqs.QueueName(tp.Exchange, tp.Queues[0].Name, false))
	_, err := c.PurgeQueue(benchCtx(b), &awssqs.PurgeQueueInput{QueueUrl: aws.String(url)})
	must(b, err)
}
