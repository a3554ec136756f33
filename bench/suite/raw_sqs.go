package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ferrymq/ferry/broker"
)

// SQS's limits on one SendMessageBatch call, from the SQS API reference
// (SendMessageBatch): at most 10 entries, and at most 262,144 bytes (256
// KiB, the default MaximumMessageSize that ElasticMQ enforces on a call)
// of bodies and attributes together.
const (
	sqsBatchEntries = 10
	sqsBatchBytes   = 262144
	// sqsSendConcurrency is the number of SendMessageBatch calls one
	// publisher has in flight, as one Publish of brokers/sqs (its
	// DefaultSendConcurrency).
	sqsSendConcurrency = 16
	// sqsPollers is the number of ReceiveMessage loops of the raw
	// consumer, as many as brokers/sqs runs for a Prefetch of 40 (the Go
	// benchmarks' worker).
	sqsPollers = 4
)

// sqsRawClient is aws-sdk-go-v2/service/sqs on a standard queue of its
// own. Its URL is the endpoint (http://127.0.0.1:9324 for ElasticMQ);
// the region is AWS_REGION (default us-east-1). An acked message is
// deleted (DeleteMessageBatch), so replay is not supported.
type sqsRawClient struct {
	endpoint string
	c        *awssqs.Client
	queue    string
	url      string
}

func newSQSRawClient(ctx context.Context, endpoint string) (*sqsRawClient, error) {
	region := os.Getenv("AWS_REGION")
	if region == "" {
		region = "us-east-1"
	}
	opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithRegion(region)}
	if u, err := url.Parse(endpoint); err == nil && os.Getenv("AWS_ACCESS_KEY_ID") == "" {
		if ip := net.ParseIP(u.Hostname()); u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback()) {
			// A local emulator takes any credentials.
			opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("ferry", "ferry", "")))
		}
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("bench: raw sqs: AWS configuration: %w", err)
	}
	c := awssqs.NewFromConfig(cfg, func(o *awssqs.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	})
	r := &sqsRawClient{endpoint: endpoint, c: c, queue: uniqueName("benchraw")}
	out, err := c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(r.queue),
		Attributes: map[string]string{"VisibilityTimeout": "60", "MessageRetentionPeriod": "3600"}})
	if err != nil {
		return nil, fmt.Errorf("bench: raw sqs: create queue: %w", err)
	}
	r.url = aws.ToString(out.QueueUrl)
	return r, nil
}

// SQSPublish sends n messages with body to the queue at queueURL through
// c: publishers at once, each taking the next batch of batch messages and
// sending it as SendMessageBatch calls of at most 10 entries and 256 KiB,
// 16 calls in flight, all awaited before its next batch (the relay's shape
// through brokers/sqs), with the message attributes the adapter sends for
// an outbox row (ferry-id, ferry-type, ferry-key, ferry-headers). It
// returns the elapsed time; a failed call or an entry SQS lists as Failed
// is an error. The Go benchmarks and ferry bench share it.
func SQSPublish(ctx context.Context, c *awssqs.Client, queueURL string, n, publishers, batch int, body []byte) (time.Duration, error) {
	str := func(v string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	hdrs, _ := json.Marshal(map[string]string{broker.HeaderTraceparent: traceparent, broker.HeaderCreatedAt: broker.FormatTime(time.Now())})
	headers, sbody := string(hdrs), string(body)
	// entry is one message and the bytes SQS counts for it: the body and
	// each attribute's name, type and value.
	entry := func(id int) (types.SendMessageBatchRequestEntry, int) {
		sid, key := strconv.Itoa(id), "user-"+strconv.Itoa(id%100)
		attrs := map[string]types.MessageAttributeValue{
			"ferry-id": str(sid), "ferry-type": str(EventType), "ferry-key": str(key), "ferry-headers": str(headers),
		}
		size := len(sbody)
		for k, v := range attrs {
			size += len(k) + len("String") + len(aws.ToString(v.StringValue))
		}
		return types.SendMessageBatchRequestEntry{Id: aws.String("m" + sid), MessageBody: aws.String(sbody), MessageAttributes: attrs}, size
	}
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		failed  atomic.Bool
		failure error
	)
	fail := func(err error) {
		errOnce.Do(func() { failure = err })
		failed.Store(true)
	}
	start := time.Now()
	for range publishers {
		wg.Go(func() {
			sem := make(chan struct{}, sqsSendConcurrency)
			for {
				first := int(next.Add(int64(batch))) - batch
				if first >= n || failed.Load() {
					return
				}
				var calls [][]types.SendMessageBatchRequestEntry
				var cur []types.SendMessageBatchRequestEntry
				sum := 0
				for id := first + 1; id <= min(first+batch, n); id++ {
					e, size := entry(id)
					if len(cur) > 0 && (len(cur) == sqsBatchEntries || sum+size > sqsBatchBytes) {
						calls, cur, sum = append(calls, cur), nil, 0
					}
					cur, sum = append(cur, e), sum+size
				}
				calls = append(calls, cur)
				var cwg sync.WaitGroup
				for _, entries := range calls {
					sem <- struct{}{}
					cwg.Go(func() {
						defer func() { <-sem }()
						out, err := c.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: entries})
						switch {
						case err != nil:
							fail(fmt.Errorf("bench: raw sqs SendMessageBatch: %w", err))
						case len(out.Failed) > 0:
							f := out.Failed[0]
							fail(fmt.Errorf("bench: raw sqs SendMessageBatch: %d of %d entries failed, first %s: %s",
								len(out.Failed), len(entries), aws.ToString(f.Code), aws.ToString(f.Message)))
						}
					})
				}
				cwg.Wait()
			}
		})
	}
	wg.Wait()
	return time.Since(start), failure
}

func (r *sqsRawClient) publish(ctx context.Context, n, size int) (time.Duration, error) {
	return SQSPublish(ctx, r.c, r.url, n, relayConcurrency, relayBatch, EventBody(1, size))
}

// consume receives n messages with sqsPollers ReceiveMessage loops (10 a
// call, long-polling 1 s) and deletes each call's messages with one
// DeleteMessageBatch (SQS's ack) before the loop's next call. A message
// received again (its visibility timeout ran out) counts once. Once n
// arrived, the other loops finish their call in flight (cancelling it
// would leave the SDK an unread response).
func (r *sqsRawClient) consume(ctx context.Context, n int) (time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu      sync.Mutex
		seen    = make(map[string]struct{}, n)
		wg      sync.WaitGroup
		errOnce sync.Once
		failure error
		enough  atomic.Bool
		doneAt  time.Time // when the n-th arrived, under mu
	)
	fail := func(err error) {
		errOnce.Do(func() { failure = err })
		cancel()
	}
	start := time.Now()
	for range sqsPollers {
		wg.Go(func() {
			for ctx.Err() == nil && !enough.Load() {
				out, err := r.c.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: aws.String(r.url),
					MaxNumberOfMessages: sqsBatchEntries, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
				if err != nil {
					if ctx.Err() == nil {
						fail(fmt.Errorf("bench: raw sqs ReceiveMessage: %w", err))
					}
					return
				}
				if len(out.Messages) == 0 {
					continue
				}
				entries := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
				for i, m := range out.Messages {
					entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String("d" + strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
				}
				del, err := r.c.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(r.url), Entries: entries})
				if err != nil {
					if ctx.Err() == nil {
						fail(fmt.Errorf("bench: raw sqs DeleteMessageBatch: %w", err))
					}
					return
				}
				if len(del.Failed) > 0 {
					fail(fmt.Errorf("bench: raw sqs DeleteMessageBatch: %d entries failed, first %s", len(del.Failed), aws.ToString(del.Failed[0].Message)))
					return
				}
				mu.Lock()
				for _, m := range out.Messages {
					seen[aws.ToString(m.MessageId)] = struct{}{}
				}
				if len(seen) >= n && !enough.Load() {
					doneAt = time.Now()
					enough.Store(true)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if failure != nil {
		return 0, failure
	}
	mu.Lock()
	got := len(seen)
	mu.Unlock()
	if got < n {
		return 0, fmt.Errorf("bench: raw sqs: received %d of %d messages: %w", got, n, context.Cause(ctx))
	}
	return doneAt.Sub(start), nil
}

// replay: SQS deletes a message when it is acked (DeleteMessage), so
// consumed history cannot be read again; a queue keeps only what is not
// yet acked. It checks that by one more ReceiveMessage, which must find
// the queue empty.
func (r *sqsRawClient) replay(ctx context.Context, _ int) (time.Duration, error) {
	out, err := r.c.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: aws.String(r.url),
		MaxNumberOfMessages: sqsBatchEntries, WaitTimeSeconds: 1})
	if err != nil {
		return 0, fmt.Errorf("bench: raw sqs ReceiveMessage after the acks: %w", err)
	}
	return 0, fmt.Errorf("%w: SQS deletes a message when its consumer acks it (DeleteMessage) and has no log to re-read; "+
		"a ReceiveMessage after the acks returned %d messages", errNoReplay, len(out.Messages))
}

// version names the endpoint: the SQS API does not report the server's
// release.
func (r *sqsRawClient) version() string { return "SQS API at " + r.endpoint }

func (r *sqsRawClient) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Best effort, as the other raw clients' clean-up.
	_, _ = r.c.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(r.url)})
}
