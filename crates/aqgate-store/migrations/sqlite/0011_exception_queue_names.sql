-- A queue table's default exception queue is named as Oracle names it, AQ$_<TABLE>_E (it
-- was AQ$<TABLE>_E): the old rows are renamed, so that their messages stay in the queue.
UPDATE queues
   SET name = substr(name, 1, instr(name, '.AQ$') + 3) || '_' || substr(name, instr(name, '.AQ$') + 4)
 WHERE name LIKE '%.AQ$%\_E' ESCAPE '\'
   AND substr(name, instr(name, '.AQ$') + 4, 1) <> '_'
   AND NOT EXISTS (
       SELECT 1 FROM queues o
        WHERE o.name = substr(queues.name, 1, instr(queues.name, '.AQ$') + 3) || '_'
                       || substr(queues.name, instr(queues.name, '.AQ$') + 4));
UPDATE messages
   SET exception_queue = substr(exception_queue, 1, instr(exception_queue, '.AQ$') + 3) || '_'
                         || substr(exception_queue, instr(exception_queue, '.AQ$') + 4)
 WHERE exception_queue LIKE '%.AQ$%\_E' ESCAPE '\'
   AND substr(exception_queue, instr(exception_queue, '.AQ$') + 4, 1) <> '_';
