-- A queue table's default exception queue is named as Oracle names it, AQ$_<TABLE>_E (it
-- was AQ$<TABLE>_E): the old rows are renamed, so that their messages stay in the queue.
UPDATE queues q
   SET name = regexp_replace(q.name, '\.AQ\$', '.AQ$_')
 WHERE q.name ~ '\.AQ\$[^_].*_E$'
   AND NOT EXISTS (SELECT 1 FROM queues o WHERE o.name = regexp_replace(q.name, '\.AQ\$', '.AQ$_'));
UPDATE messages
   SET exception_queue = regexp_replace(exception_queue, '\.AQ\$', '.AQ$_')
 WHERE exception_queue ~ '\.AQ\$[^_].*_E$';
