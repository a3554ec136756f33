package sqs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestServersDiffer pins, on ElasticMQ 1.6.11 and moto 5.1 (the two SQS
// implementations compose/local/services.sh runs), each behaviour in which
// they differ, with what AWS documents, so that no test result is one
// emulator's quirk without saying so, and a server upgrade that changes
// one shows here first. Found so far:
//
//   - An empty message attribute value. AWS: refused ("Name, type, value
//     and the message body must not be empty or null", SQS Developer
//     Guide, "Amazon SQS message attributes"). ElasticMQ refuses the entry
//     (InvalidAttributeValue, sender fault); moto takes it and hands the
//     message out without the attribute. The adapter refuses a message
//     without ID or Type itself (ErrInvalidMessage), before any call.
//   - A body character outside the allowed set (#x9 #xA #xD #x20-#xD7FF
//     #xE000-#xFFFD #x10000-#x10FFFF). AWS: "Any characters not included
//     in this list will be rejected" (SQS API Reference, SendMessage,
//     MessageBody). ElasticMQ refuses U+0001 per entry (InvalidAttributeValue,
//     "InvalidMessageContents") and U+FFFF with the whole call (HTTP 400
//     InvalidAction: its JSON parser stops there); moto takes both. So the
//     conformance suite's PoisonAmongGood has a poison on ElasticMQ only,
//     and a message AWS would refuse passes on moto.
//   - MaximumMessageSize and MessageRetentionPeriod. AWS reports both
//     (SQS API Reference, GetQueueAttributes); moto does (1,048,576 bytes,
//     AWS's default since 2025), ElasticMQ reports neither, so the adapter
//     falls back to Config.FallbackMessageBytes (256 KiB) there.
//   - A MessageDeduplicationId after its message was deleted. AWS keeps it
//     for the 5-minute window (SQS Developer Guide, "Using the message
//     deduplication ID"), as ElasticMQ does; moto forgets it:
//     TestFIFODedupInsideWindow.
//   - Concurrent ReceiveMessage calls. AWS hides a received message from
//     other consumers for its visibility timeout (SQS Developer Guide,
//     "Amazon SQS visibility timeout"; a standard queue may, rarely,
//     deliver a copy again). moto 5.1 checks a message's visibility and
//     marks it received without a lock (moto/sqs/models.py,
//     receive_message), so two concurrent receives can both return it: on a
//     loaded machine the conformance suite's ConcurrentReceivers saw a
//     message twice from one subscription's two pollers. Not reproducible
//     on demand, so not pinned here; moto's conformance harness runs one
//     poller per subscription (TestConformanceMoto).
//
// Where both differ from AWS alike it is pinned too: both let a queue be
// created again right after it was deleted, where AWS makes you wait 60 s
// (SQS API Reference, DeleteQueue); the adapter retries such a create.
func TestServersDiffer(t *testing.T) {
	type want struct {
		emptyAttr     string // "refused entry" or "accepted"
		ctrlChar      string // U+0001: "refused entry" or "accepted"
		nonChar       string // U+FFFF: "refused call" or "accepted"
		reportsLimits bool   // MaximumMessageSize and MessageRetentionPeriod
	}
	wants := map[string]want{
		"elasticmq": {emptyAttr: "refused entry", ctrlChar: "refused entry", nonChar: "refused call"},
		"moto":      {emptyAttr: "accepted", ctrlChar: "accepted", nonChar: "accepted", reportsLimits: true},
	}
	for _, srv := range sqsServers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			w := wants[srv.name]
			ctx := ctxFor(t, 90*time.Second) // a bound on a hung server (moto is one Python process)
			cfg := config()
			cfg.Endpoint = srv.endpoint
			testenv.RequireTCP(t, srv.role, testenv.HostPort(srv.endpoint))
			b, err := sqs.New(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = b.Close() })
			c := b.Client()
			name := testenv.UniqueName("differ")
			q, err := c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name)})
			require.NoError(t, err)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if u, err := c.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(name)}); err == nil {
					_, _ = c.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: u.QueueUrl})
				}
			})

			// send sends a good entry and a bad one in one call and says
			// what happened to the bad one.
			send := func(bad types.SendMessageBatchRequestEntry) string {
				t.Helper()
				bad.Id = aws.String("bad")
				out, err := c.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: q.QueueUrl, Entries: []types.SendMessageBatchRequestEntry{
					{Id: aws.String("good"), MessageBody: aws.String("good")}, bad}})
				if err != nil {
					var re *awshttp.ResponseError
					var ae smithy.APIError
					require.True(t, errors.As(err, &re) && re.HTTPStatusCode() == 400 && errors.As(err, &ae), "a refused call is HTTP 400 with an API error: %v", err)
					t.Logf("%s: the whole call refused: %s: %.100s", srv.name, ae.ErrorCode(), ae.ErrorMessage())
					return "refused call"
				}
				for _, f := range out.Failed {
					require.Equal(t, "bad", aws.ToString(f.Id), "only the bad entry may fail")
					require.True(t, f.SenderFault, "a refused entry is the sender's fault")
					t.Logf("%s: entry refused: %s: %s", srv.name, aws.ToString(f.Code), aws.ToString(f.Message))
					return "refused entry"
				}
				require.Len(t, out.Successful, 2)
				return "accepted"
			}
			require.Equal(t, w.emptyAttr, send(types.SendMessageBatchRequestEntry{MessageBody: aws.String("x"),
				MessageAttributes: map[string]types.MessageAttributeValue{"ferry-id": {DataType: aws.String("String"), StringValue: aws.String("")}}}),
				"an empty attribute value")
			require.Equal(t, w.ctrlChar, send(types.SendMessageBatchRequestEntry{MessageBody: aws.String("a\x01b")}), "a body holding U+0001")
			require.Equal(t, w.nonChar, send(types.SendMessageBatchRequestEntry{MessageBody: aws.String("a\uffffb")}), "a body holding U+FFFF")

			attrs, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl,
				AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll}})
			require.NoError(t, err)
			_, size := attrs.Attributes["MaximumMessageSize"]
			_, retention := attrs.Attributes["MessageRetentionPeriod"]
			require.Equal(t, w.reportsLimits, size, "MaximumMessageSize reported: %v", attrs.Attributes)
			require.Equal(t, w.reportsLimits, retention, "MessageRetentionPeriod reported: %v", attrs.Attributes)

			_, err = c.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: q.QueueUrl})
			require.NoError(t, err)
			_, err = c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name)})
			require.NoError(t, err, "created again at once (AWS: not within 60 s of the delete)")
		})
	}
}
